"""The one exception type for problems a user can fix."""


class KronosError(ValueError):
    """Bad input, a bad checkpoint, bad data: a one-line message saying what and where.

    Subclasses ValueError so code written against the reference implementation,
    which raises ValueError for bad DataFrames, keeps catching it.
    """


class KronosWarning(UserWarning):
    """Something a user should change but that still works (e.g. an old config key): one line of text."""
