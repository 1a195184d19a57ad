"""The worker's request loop: a reader thread takes request lines, pool threads run them and write answers.

No event loop sits between the two: a pool thread writes its own answer the moment it is done (under a
lock, so lines never interleave), which saves a thread wake-up per request over handing the answer back.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import BinaryIO

from iris_rag.errors import RagError
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.worker.dispatch import CONTROL, Dispatcher
from iris_rag.worker.protocol import Request, error_line, parse_request, success_line

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 256 * 1024 * 1024
# Below the front end's 3 s before it kills the worker; an unfinished ingest simply rolls back.
SHUTDOWN_GRACE_S = 2.5


def claim_stdout() -> BinaryIO:
    """Keep the real stdout for the protocol and point fd 1 at stderr, so no stray print corrupts it."""
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


class WorkerServer:
    """Serves one request stream until EOF or a shutdown request."""

    def __init__(self, dispatcher: Dispatcher, output: BinaryIO, work_threads: int) -> None:
        self.dispatcher = dispatcher
        self.output = output
        # Cheap control methods have their own threads, so slow queries never hold them up.
        self.work = ThreadPoolExecutor(work_threads, thread_name_prefix="work")
        self.control = ThreadPoolExecutor(2, thread_name_prefix="control")
        self.running: set[Future[None]] = set()
        self._write_lock = threading.Lock()

    def write(self, line: bytes) -> None:
        """Write one whole response line; a pipe may take a large line in several writes."""
        with self._write_lock:
            view = memoryview(line)
            while view:
                written = self.output.write(view)
                view = view[written or 0 :]

    def answer(self, request: Request) -> None:
        """Run one request and write its answer (on a pool thread)."""
        ok, payload = self.dispatcher.call(request.method, request.params)
        try:
            self.write(success_line(request.id, payload) if ok else error_line(request.id, payload))
        except OSError as exc:
            # The front end has gone (a broken pipe): nobody is left to answer.
            logger.warning("could not answer request %r: %s", request.id, exc)

    def serve(self, source: BinaryIO | None = None) -> bool:
        """Read until EOF or shutdown, then let running requests finish; False if some did not in time."""
        reader = source if source is not None else sys.stdin.buffer
        while True:
            line = reader.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                _skip_rest_of_line(reader)
                self.write(error_line(None, {"code": "MALFORMED_REQUEST", "message": "line too long"}))
                continue
            if not line.strip():
                continue
            try:
                request = parse_request(line)
            except RagError as exc:
                self.write(error_line(exc.details.get("id"), exc.to_dict()))
                continue
            executor = self.control if request.method in CONTROL else self.work
            future = executor.submit(self.answer, request)
            self.running.add(future)
            future.add_done_callback(self.running.discard)
            if request.method == "shutdown":
                break
        _, unfinished = wait(list(self.running), timeout=SHUTDOWN_GRACE_S)
        self.work.shutdown(wait=False, cancel_futures=True)
        self.control.shutdown(wait=False, cancel_futures=True)
        return not unfinished


def _skip_rest_of_line(reader: BinaryIO) -> None:
    while True:
        part = reader.readline(1 << 20)
        if not part or part.endswith(b"\n"):
            return


def main() -> None:
    """Entry point of `python -m iris_rag.bridge`."""
    output = claim_stdout()
    limit_blas_threads()
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s worker %(levelname)s %(message)s",
    )
    service = RagService(settings)
    server = WorkerServer(Dispatcher(service), output, settings.worker_threads)
    logger.info("worker ready (pid %d, data %s)", os.getpid(), settings.database_path)
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
