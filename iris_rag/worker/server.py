"""The worker's request loop: a reader thread takes request lines, pool threads run them and write answers.

No event loop sits between the two: a pool thread writes its own answer the moment it is done (under a
lock, so lines never interleave), which saves a thread wake-up per request over handing the answer back.

Each work request gets a CancelToken, current on the thread that runs it; a `cancel` request (the front
end's client cancel or time-out) sets it, and the work stops at its next `check_cancelled()`. It gets a
ProgressSink too: each step it reports goes out at once as a `progress` event line with its request id.
At most `max_in_flight` work requests are accepted at once (the front end's MAX_CONCURRENT_REQUESTS): a
front end that gave up waiting on a wedged call cannot pile more calls into the pool than that.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.errors import RagError, ResultTooLargeError
from iris_rag.progress import ProgressSink, progress_scope
from iris_rag.redaction import redact_logs
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import SettingsError, load_settings
from iris_rag.worker.dispatch import CONTROL, Dispatcher, caller_waited_ms
from iris_rag.worker.protocol import (
    CANCEL_REASONS,
    MAX_ANSWER_BYTES,
    TIMEOUT_REASON,
    Request,
    RequestId,
    error_line,
    parse_request,
    progress_line,
    read_request_id,
    ready_line,
    success_line,
)

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 256 * 1024 * 1024
# Below the front end's 3 s before it kills the worker; an unfinished ingest simply rolls back.
SHUTDOWN_GRACE_S = 2.5
DEFAULT_MAX_IN_FLIGHT = 8


def claim_stdout() -> BinaryIO:
    """Keep the real stdout for the protocol and point fd 1 at stderr, so no stray print corrupts it."""
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


@dataclass(slots=True)
class _Admitted:
    """A work request from admission until its answer is written."""

    request: Request
    token: CancelToken
    received: float  # time.perf_counter() when the reader took it
    recorded: bool = False  # its call record is written (by its cancel, or by its run's end)


class WorkerServer:
    """Serves one request stream until EOF or a shutdown request."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        output: BinaryIO,
        work_threads: int,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.dispatcher = dispatcher
        self.output = output
        self.max_in_flight = max_in_flight
        # More threads than admitted requests would never be used.
        self.work = ThreadPoolExecutor(min(work_threads, max_in_flight), thread_name_prefix="work")
        # Cheap control methods have their own threads, so slow queries never hold them up.
        self.control = ThreadPoolExecutor(2, thread_name_prefix="control")
        self.running: set[Future[None]] = set()
        self._write_lock = threading.Lock()
        # Every admitted work request, by request id, until its answer is written.
        self._admitted: dict[RequestId, _Admitted] = {}
        self._admitted_lock = threading.Lock()

    def write(self, line: bytes) -> None:
        """Write one whole response line; a pipe may take a large line in several writes."""
        with self._write_lock:
            view = memoryview(line)
            while view:
                written = self.output.write(view)
                view = view[written or 0 :]

    def answer(self, request: Request, token: CancelToken | None = None) -> None:
        """Run one request and write its answer (on a pool thread), inside its cancellation scope."""
        lines: list[bytes] = []

        def encode(ok: bool, payload: dict[str, Any]) -> str | None:
            line, refused = _answer_line(request, ok, payload)
            lines.append(line)
            return refused

        call = (request.method, request.params, request.principal, encode)
        try:
            if token is None:
                self.dispatcher.call(*call, sent_at=request.sent_at)
            else:
                sink = ProgressSink(lambda steps, message: self._progress(request.id, steps, message))
                with cancellation_scope(token), progress_scope(sink):
                    claim = partial(self._claim_record, request.id)
                    self.dispatcher.call(*call, sent_at=request.sent_at, claim_record=claim)
        finally:
            with self._admitted_lock:
                self._admitted.pop(request.id, None)
        try:
            self.write(lines[0])
        except OSError as exc:
            # The front end has gone (a broken pipe): nobody is left to answer.
            logger.warning("could not answer request %r: %s", request.id, exc)

    def _progress(self, request_id: RequestId, steps: int, message: str) -> None:
        try:
            self.write(progress_line(request_id, steps, message))
        except OSError as exc:  # the front end has gone; the answer's write will say so too
            logger.debug("could not report progress of %r: %s", request_id, exc)

    def _claim_record(self, request_id: RequestId) -> bool:
        """Whether the run may write the request's call record: not if its cancel already did; once only."""
        with self._admitted_lock:
            admitted = self._admitted[request_id]
            claimed = not admitted.recorded
            admitted.recorded = True
            return claimed

    def cancel(self, cancel: Request) -> dict[str, Any]:
        """Set the token of a running or waiting request; unknown ids (already answered) are a no-op.

        The front end sends a cancel once it has answered the caller (TIMEOUT_EXCEEDED or REQUEST_CANCELLED),
        so the call is recorded now, as the caller got it and with the time it waited, not when (or if) the
        work stops later.
        """
        params = cancel.params
        reason = CANCEL_REASONS.get(str(params.get("reason")), CANCEL_REASONS["client"])
        with self._admitted_lock:
            admitted = self._admitted.get(params.get("request_id"))
            to_record = admitted is not None and not admitted.recorded
            if admitted is not None:
                admitted.recorded = True
        if admitted is None:
            return {"cancelled": False}
        admitted.token.cancel(reason)
        if to_record:
            request = admitted.request
            code = "TIMEOUT_EXCEEDED" if reason == TIMEOUT_REASON else "REQUEST_CANCELLED"
            self.dispatcher.record_answered(
                request.method, request.params, request.principal, code, _waited_ms(admitted, cancel)
            )
        return {"cancelled": True}

    def cancel_all(self, reason: str) -> None:
        """Cancel every admitted request (shutdown: an unfinished ingest rolls back at its checkpoint)."""
        with self._admitted_lock:
            tokens = [admitted.token for admitted in self._admitted.values()]
        for token in tokens:
            token.cancel(reason)

    def submit(self, request: Request) -> None:
        """Hand a request to its pool, or refuse it at once when the work pool is full."""
        token: CancelToken | None = None
        if request.method in CONTROL:
            executor = self.control
        else:
            executor = self.work
            token = CancelToken()
            with self._admitted_lock:
                # Answers, progress and cancels name a request by its id: a second one in flight under the
                # same id (only a client of the worker itself can send it) could not be told apart.
                taken = request.id in self._admitted
                full = len(self._admitted) >= self.max_in_flight
                if not (taken or full):
                    self._admitted[request.id] = _Admitted(request, token, time.perf_counter())
            if taken:
                message = f"request id {request.id!r} is already in flight; each request needs its own id"
                self.write(error_line(request.id, {"code": "MALFORMED_REQUEST", "message": message}))
                return
            if full:
                message = f"{self.max_in_flight} requests already running (MAX_CONCURRENT_REQUESTS)"
                self.write(error_line(request.id, {"code": "RATE_LIMIT_EXCEEDED", "message": message}))
                return
        future = executor.submit(self.answer, request, token)
        self.running.add(future)
        future.add_done_callback(self.running.discard)

    def serve(self, source: BinaryIO | None = None) -> bool:
        """Read until EOF or shutdown, then let running requests finish; False if some did not in time."""
        reader = source if source is not None else sys.stdin.buffer
        while True:
            line = reader.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                _skip_rest_of_line(reader)
                error = {"code": "MALFORMED_REQUEST", "message": "line too long"}
                self.write(error_line(read_request_id(line), error))
                continue
            if not line.strip():
                continue
            try:
                request = parse_request(line)
            except RagError as exc:
                self.write(error_line(exc.details.get("id"), exc.to_dict()))
                continue
            if request.method == "cancel":
                # Answered here, at once: a cancel must not wait behind the work it cancels.
                self.write(success_line(request.id, self.cancel(request)))
                continue
            self.submit(request)
            if request.method == "shutdown":
                break
        self.cancel_all("the worker is shutting down")
        _, unfinished = wait(list(self.running), timeout=SHUTDOWN_GRACE_S)
        self.work.shutdown(wait=False, cancel_futures=True)
        self.control.shutdown(wait=False, cancel_futures=True)
        return not unfinished


def _waited_ms(admitted: _Admitted, cancel: Request) -> float:
    """How long the caller of a cancelled request waited: from its request to its cancel.

    The front end stamps both: the request as it took the call, the cancel as it answered the caller.
    """
    sent_at = admitted.request.sent_at
    if sent_at is not None and cancel.sent_at is not None and cancel.sent_at >= sent_at:
        return (cancel.sent_at - sent_at) * 1000
    return caller_waited_ms(sent_at, (time.perf_counter() - admitted.received) * 1000)


def _answer_line(request: Request, ok: bool, payload: dict[str, Any]) -> tuple[bytes, str | None]:
    """The answer line of an outcome, and the error code it carries in its place if it cannot carry it."""
    try:
        line = success_line(request.id, payload) if ok else error_line(request.id, payload)
    except (TypeError, ValueError) as exc:  # a result orjson refuses: answer, or the caller waits for ever
        logger.exception("the answer to %s could not be encoded", request.method)
        message = f"the answer could not be encoded ({exc}); this is a server bug, please report it"
        return error_line(request.id, {"code": "INTERNAL_ERROR", "message": message}), "INTERNAL_ERROR"
    if len(line) > MAX_ANSWER_BYTES:
        too_large = _too_large(request.method, len(line))
        return error_line(request.id, too_large.to_dict()), too_large.code
    return line, None


def _too_large(method: str, size: int) -> ResultTooLargeError:
    message = (
        f"the answer to {method} is {size:,} bytes, past the {MAX_ANSWER_BYTES:,}-byte limit of one answer; "
        "ask for less (fewer rows, documents or results, shorter text)"
    )
    return ResultTooLargeError(message, {"bytes": size, "max_bytes": MAX_ANSWER_BYTES})


def _skip_rest_of_line(reader: BinaryIO) -> None:
    while True:
        part = reader.readline(1 << 20)
        if not part or part.endswith(b"\n"):
            return


def main() -> None:
    """Entry point of `python -m iris_rag.bridge`."""
    output = claim_stdout()
    limit_blas_threads()
    try:
        settings = load_settings()
    except SettingsError as exc:
        # One line naming the variable (never a value: one may be a key); bridge.ts reads "fatal CODE:".
        sys.stderr.write(f"fatal WORKER_UNAVAILABLE: {exc}\n")
        sys.stderr.flush()
        os._exit(1)
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s worker %(levelname)s %(message)s",
    )
    redact_logs(settings.llm_secrets)
    try:
        service = RagService(settings)
    except (RagError, SettingsError) as exc:
        # The front end answers every call with this code (bridge.ts reads the "fatal CODE:" line).
        code, message = (exc.code, exc.message) if isinstance(exc, RagError) else ("WORKER_UNAVAILABLE", exc)
        sys.stderr.write(f"fatal {code}: {message}\n")
        sys.stderr.flush()
        os._exit(1)
    server = WorkerServer(
        Dispatcher(service), output, settings.worker_threads, settings.max_concurrent_requests
    )
    logger.info("worker ready (pid %d, data %s)", os.getpid(), settings.database_path)
    server.write(ready_line(os.getpid()))
    drained = False
    try:
        drained = server.serve()
    finally:
        if drained:
            service.close()
        else:
            # Closing the store under a query that is still running crashes SQLite's C code; exiting
            # without closing is safe: WAL keeps every committed transaction and rolls back the open one.
            logger.warning("exiting with requests still running after %.1fs", SHUTDOWN_GRACE_S)
    # Daemon threads (model loading) must not keep a finished worker alive.
    os._exit(0)


__all__ = ["Request", "WorkerServer", "claim_stdout", "main"]
