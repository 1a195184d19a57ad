"""The worker's event loop: reads request lines, runs them concurrently, writes answers as they finish."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from iris_rag.errors import RagError
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
        self.work = ThreadPoolExecutor(work_threads, thread_name_prefix="work")
        self.control = ThreadPoolExecutor(2, thread_name_prefix="control")
        self.tasks: set[asyncio.Task[None]] = set()

    def write(self, line: bytes) -> None:
        """Write one response line (called only from the event loop thread, so lines never interleave)."""
        self.output.write(line)

    async def handle(self, line: bytes) -> None:
        """Answer one line."""
        try:
            request = parse_request(line)
        except RagError as exc:
            self.write(error_line(exc.details.get("id"), exc.to_dict()))
            return
        executor = self.control if request.method in CONTROL else self.work
        loop = asyncio.get_running_loop()
        ok, payload = await loop.run_in_executor(
            executor, self.dispatcher.call, request.method, request.params
        )
        self.write(success_line(request.id, payload) if ok else error_line(request.id, payload))

    async def serve(self) -> bool:
        """Read until EOF or shutdown, then let in-flight requests finish; False if some did not in time."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        while True:
            try:
                line = await reader.readline()
            except ValueError:
                self.write(error_line(None, {"code": "MALFORMED_REQUEST", "message": "line too long"}))
                continue
            if not line:
                break
            if not line.strip():
                continue
            task = asyncio.create_task(self.handle(line))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            if _is_shutdown(line):
                break
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=SHUTDOWN_GRACE_S)
        self.work.shutdown(wait=False, cancel_futures=True)
        self.control.shutdown(wait=False, cancel_futures=True)
        return not self.tasks


def _is_shutdown(line: bytes) -> bool:
    try:
        return parse_request(line).method == "shutdown"
    except RagError:
        return False


def main() -> None:
    """Entry point of `python -m iris_rag.bridge`."""
    output = claim_stdout()
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
        drained = asyncio.run(server.serve())
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
