"""Ctrl-C / SIGTERM / SIGHUP -> stop at the next optimizer-step boundary and save a resumable checkpoint.

SIGHUP (the terminal closed: an ssh session dropped, a window shut) is taken as SIGTERM by every long job,
so a closed terminal stops it as cleanly as `kill` does. The first stop signal a process took is kept
(`stop_signal_name`): run.json says which one ended the run (kronos_tune.runs).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol


# The signals that ask a job to stop; SIGHUP is missing on Windows.
STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM) + (
    (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
# Those that stop it at once, as SIGTERM (a second Ctrl-C aside): everything but SIGINT.
TERMINATING_SIGNALS: tuple[int, ...] = tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)

_received: list[str] = []  # stop signals this process took, by name, first first


def record_stop_signal(signum: int) -> None:
    """Keep `signum` as one that asked this process to stop (handlers call it)."""
    _received.append(signal.Signals(signum).name)


def stop_signal_name() -> str | None:
    """The first stop signal this process took since the job began ('SIGHUP', ...), None without one."""
    return _received[0] if _received else None


def forget_stop_signals() -> None:
    """A new job begins: earlier signals are not its own."""
    _received.clear()


class Stoppable(Protocol):
    def request_stop(self) -> None: ...


class StopForwarder:
    """Catches a stop request that arrives before the trainer exists and hands it over on `attach`."""

    def __init__(self) -> None:
        self.requested = False
        self._target: Stoppable | None = None

    def request_stop(self) -> None:
        self.requested = True
        if self._target is not None:
            self._target.request_stop()

    def attach(self, target: Stoppable) -> None:
        self._target = target
        if self.requested:
            target.request_stop()


@contextlib.contextmanager
def _handling(signals: tuple[int, ...], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """`handler` for `signals` while active; the handlers before it are put back after."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stop_on_signals(target: Stoppable, second_interrupts: bool = True,
                    signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """While active, the first SIGINT/SIGTERM/SIGHUP calls ``target.request_stop()``.

    With ``second_interrupts`` a second SIGINT raises KeyboardInterrupt at once
    (an impatient user at a terminal); without it, later signals are ignored
    so the checkpoint is always written (workers under torchrun, whose agent
    forwards one signal and escalates to SIGKILL on its own timeout). Only the
    main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    forget_stop_signals()

    def handler(signum: int, frame: Any) -> None:
        if received and second_interrupts and signum == signal.SIGINT:
            raise KeyboardInterrupt
        received.append(signum)
        record_stop_signal(signum)
        target.request_stop()

    with _handling(signals, handler):
        yield


@contextlib.contextmanager
def interrupt_on_signals(signals: tuple[int, ...] = TERMINATING_SIGNALS) -> Iterator[None]:
    """While active (main thread only), SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does, so a job
    that stops cleanly on Ctrl-C (finished chunks kept, run.json marked) stops the same way on them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    forget_stop_signals()

    def handler(signum: int, frame: Any) -> None:
        record_stop_signal(signum)
        raise KeyboardInterrupt

    with _handling(signals, handler):
        yield
