"""Cooperative cancellation: the worker marks a request cancelled, long work stops at its next checkpoint.

The token of the request a thread is serving lives in a context variable, so any code on that thread
(ingest between batches, a pipeline between its stages) calls `check_cancelled()` without the token being
passed down through every signature. Threads started by the request (the encode thread) do not inherit
it: checkpoints belong on the request's own thread, between units of work.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from iris_rag.errors import RequestCancelledError


class CancelToken:
    """Set once, by the request's canceller (a client's cancel, the front end's timeout, shutdown)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled by the client") -> None:
        """Mark the request cancelled; the work stops at its next checkpoint."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called."""
        return self._event.is_set()

    def check(self) -> None:
        """Raise RequestCancelledError if the request was cancelled."""
        if self._event.is_set():
            msg = f"request cancelled: {self.reason}"
            raise RequestCancelledError(msg)


_current: ContextVar[CancelToken | None] = ContextVar("iris_rag_cancel_token", default=None)


def check_cancelled() -> None:
    """A checkpoint: raise RequestCancelledError if the request this thread serves was cancelled."""
    token = _current.get()
    if token is not None:
        token.check()


def current_token() -> CancelToken | None:
    """The token of the request this thread serves, if any (None in the CLI and in tests)."""
    return _current.get()


@contextmanager
def cancellation_scope(token: CancelToken) -> Iterator[CancelToken]:
    """Make `token` the current request's token for the duration of the block."""
    reset = _current.set(token)
    try:
        yield token
    finally:
        _current.reset(reset)
