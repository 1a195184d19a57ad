"""A time limit for a call that may hang (a FIFO opened for reading, a loop that never ends)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def within(seconds: float, call: Callable[[], T], *, unblock: Callable[[], None] | None = None) -> T:
    """call's result; still running after `seconds`, it fails the test instead of hanging the suite.

    `unblock`, when given, is run on a timeout to free the stuck thread (a FIFO's other end opened, say);
    without it the thread is left behind as a daemon.
    """
    outcome: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # re-raised in the test's own thread
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if unblock is not None:
            unblock()
            thread.join(seconds)
        pytest.fail(f"still running after {seconds} s")
    if raised:
        raise raised[0]
    return outcome[0]


def release_fifo(path: Path) -> Callable[[], None]:
    """An `unblock` for a reader stuck opening the FIFO at path: its writing end opened and closed."""

    def release() -> None:
        with contextlib.suppress(OSError):  # no reader waiting: nothing to release
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    return release
