"""What `--runner ray` needs before any work: Ray Data installed, and a cluster address that answers.

Light on purpose (no torch, no Ray import until asked): the flags are checked before any data or weights are
read (`config.check_runner`); the runner itself is `ray_runner.py`.
"""

from __future__ import annotations

import socket

from kronos_core.errors import one_line
from kronos_core.optional import require
from kronos_tune.errors import KronosTuneError

_PROBE_SECONDS = 5.0


def require_ray() -> None:
    """Ray Data importable, or one line saying how to install it (before any work)."""
    require("ray", "--runner ray", instead="leave --runner out for torchrun")


def check_address(address: str | None) -> None:
    """A HOST:PORT (or ray://HOST:PORT) cluster address that answers, checked before any work: Ray itself
    retries an unreachable address for minutes. `local`, `auto` and none are Ray's own rules."""
    if address is None or address in ("local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise KronosTuneError(f"--ray-address {address}: give HOST:PORT of the cluster's head (e.g. 10.0.0.5:6379), "
                              f"ray://HOST:PORT of a Ray client server, `auto` or `local`")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_SECONDS):
            pass
    except OSError as error:
        raise KronosTuneError(f"--ray-address {address}: no Ray cluster answers there ({one_line(error, typed=False)}); "
                              f"start it (`ray start --head` on its head node) or check the address") from None


__all__ = ["check_address", "require_ray"]
