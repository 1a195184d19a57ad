"""Progress of the request a thread serves: long work (an ingest) reports each step as it goes.

The worker makes a sink current for every work request (as it does the CancelToken); code on that thread
names its stage with `stage()` and counts steps with `advance()`, without a reporter being passed down.
The worker forwards each step to the front end as a `progress` event, which becomes the client's
`notifications/progress` and keeps the call from timing out while it makes progress. With no sink (the CLI,
tests), both are no-ops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# (steps done so far, what is happening): called on the request's thread.
Emit = Callable[[int, str], None]


class ProgressSink:
    """Counts a request's steps and emits each one; the count only grows, as MCP requires."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self.steps = 0
        self.stage = ""

    def advance(self, detail: str = "") -> None:
        """One more step done in the current stage."""
        with self._lock:
            self.steps += 1
            steps, message = self.steps, ": ".join(part for part in (self.stage, detail) if part)
        self._emit(steps, message)


_current: ContextVar[ProgressSink | None] = ContextVar("iris_rag_progress", default=None)


@contextmanager
def progress_scope(sink: ProgressSink) -> Iterator[ProgressSink]:
    """Make `sink` the current request's progress for the duration of the block."""
    reset = _current.set(sink)
    try:
        yield sink
    finally:
        _current.reset(reset)


def stage(name: str) -> None:
    """Start a named stage (it counts as a step, so a client sees it begin)."""
    sink = _current.get()
    if sink is not None:
        sink.stage = name
        sink.advance()


def advance(detail: str = "") -> None:
    """A step of the current stage is done (e.g. `detail` "64/512 chunks")."""
    sink = _current.get()
    if sink is not None:
        sink.advance(detail)
