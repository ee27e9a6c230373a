"""Ctrl-C / SIGTERM -> stop at the next optimizer-step boundary and save a resumable checkpoint."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any, Protocol


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
def stop_on_signals(target: Stoppable, second_interrupts: bool = True,
                    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """While active, the first SIGINT/SIGTERM calls ``target.request_stop()``.

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

    def handler(signum: int, frame: Any) -> None:
        if received and second_interrupts and signum == signal.SIGINT:
            raise KeyboardInterrupt
        received.append(signum)
        target.request_stop()

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
