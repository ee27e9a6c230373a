"""Errors a user can fix, shown by the CLI as one line with exit code 2."""

from kronos_core.errors import KronosError


class KronosTuneError(KronosError):
    """A usage problem in kronos-tune itself (preset, flags, output folder...)."""
