"""Preemption: SIGUSR2 (Slurm's ``--signal``) or SIGTERM only sets a flag; the trainer saves a
checkpoint at the next step boundary and exits with ``EXIT_PREEMPTED`` so the launcher requeues."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

EXIT_PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): saved, try again
SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
_early: list[signal.Signals] = []  # SIGTERMs caught by ``catch_early_sigterm`` before a flag was up


def catch_early_sigterm() -> None:
    """Remember a SIGTERM that arrives while a job is still starting (importing, loading the
    checkpoint), before the trainer's ``PreemptionFlag`` is up; the flag then starts raised.

    A launched job runs under submitit, whose handler ignores SIGTERM ("bypassing"): a cancel in
    that window was lost, and the run trained to its end while ``status`` said it was stopping."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: _early.append(signal.Signals(signum)))


class PreemptionFlag:
    """Context manager installing the handlers (main thread only) and restoring the old ones."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        # What signal.signal returned: a Python handler, SIG_DFL/SIG_IGN, or None (installed outside Python).
        self._previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signal.Signals(signum)

    def __enter__(self) -> PreemptionFlag:
        if _early:  # signalled while starting up: stop before the first step
            self.signal = _early[-1]
            _early.clear()
        # Python only lets the main thread install handlers; elsewhere (a thread-based executor)
        # the process's owner handles signals and this flag never rises.
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:  # None: installed outside Python, cannot be put back from here
                signal.signal(sig, handler)
