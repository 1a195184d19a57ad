"""A worker killed (SIGKILL) inside an ingest's write transaction leaves the store exactly as before the call.

The kill is deterministic: tests.worker.crash_worker runs the real worker with a test-only technique index
whose write() (last in the transaction, after documents, chunks, keyword rows and the real indexes' rows)
creates a signal file and blocks; the test kills the worker the moment that file appears.
"""

from __future__ import annotations

import hashlib
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import DOCUMENTS, ROOT
from tests.worker.crash_worker import SIGNAL_FILE_ENV

DATABASE = "iris_rag.sqlite3"
# Not the ingest's data: the embedding cache is committed on its own before the ingest transaction (a
# cache of text -> vector, harmless to keep), and the monitor records calls whenever it likes.
NOT_COMPARED = {"embedding_cache", "calls"}
CRASH_DOCUMENTS = [
    {"id": f"crash-{i}", "title": f"Crash {i}", "content": f"Zeolite crash document {i}. " * 30}
    for i in range(12)
]
# The killed batch also replaces a stored document: its old version must survive.
REPLACED_ASPIRIN = {"id": "aspirin", "title": "Replaced", "content": "Replaced text about zeolite."}


class Worker:
    """A worker subprocess (the real one, or the crash double) answering JSON-lines requests."""

    def __init__(self, module: str, data_dir: Path, signal_file: Path | None = None) -> None:
        env = {**os.environ, "RAG_DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING"}
        if signal_file is not None:
            env[SIGNAL_FILE_ENV] = str(signal_file)
        self.process = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.responses: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = orjson.loads(line)
            if "event" not in message:  # the ready line and progress events are not answers
                self.responses.put(message)

    def send(self, method: str, params: dict[str, Any]) -> str:
        self._next += 1
        request_id = f"r{self._next}"
        assert self.process.stdin is not None
        self.process.stdin.write(orjson.dumps({"id": request_id, "method": method, "params": params}) + b"\n")
        self.process.stdin.flush()
        return request_id

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        request_id = self.send(method, params or {})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                message = self.responses.get(timeout=0.1)
            except queue.Empty:
                continue
            if message["id"] == request_id:
                return message
        raise TimeoutError(method)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def table_digests(database: Path) -> dict[str, tuple[int, str]]:
    """Row count and a digest of the sorted rows of every table (shadow tables of FTS5 included)."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
            )
            if row[0] not in NOT_COMPARED and not row[0].startswith("sqlite_")
        ]
        digests = {}
        for name in names:
            rows = sorted(repr(row) for row in connection.execute(f'SELECT * FROM "{name}"'))
            digests[name] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
        return digests
    finally:
        connection.close()


def wait_for_file(path: Path, worker: Worker, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert worker.process.poll() is None, "the crash worker exited before its write step"
        assert time.monotonic() < deadline, "the ingest never reached the blocking index's write step"
        time.sleep(0.02)
    result: dict[str, Any] = orjson.loads(path.read_bytes())
    return result


def kill_inside_the_write(data: Path, tmp_path: Path, collection_id: str, documents: list[Any]) -> None:
    """Start the crash worker, ingest `documents`, SIGKILL it the moment its write transaction blocks."""
    signal_file = tmp_path / "inside-write.json"
    worker = Worker("tests.worker.crash_worker", data, signal_file)
    try:
        worker.send("ingest", {"collection_id": collection_id, "documents": documents})
        seen = wait_for_file(signal_file, worker)
        worker.process.send_signal(signal.SIGKILL)
        assert worker.process.wait(timeout=10) == -signal.SIGKILL
    finally:
        worker.stop()
    # What the transaction held when it was killed: the kill landed after its rows were written.
    assert seen == {
        "documents": len(CRASH_DOCUMENTS),
        "chunks": seen["chunks"],
        "index_rows": len(CRASH_DOCUMENTS),
        "in_transaction": True,
    }
    assert seen["chunks"] >= len(CRASH_DOCUMENTS)


def assert_intact(database: Path) -> None:
    connection = sqlite3.connect(database)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert connection.execute("SELECT count(*) FROM documents WHERE id LIKE 'crash-%'").fetchone() == (0,)
        assert connection.execute(
            "SELECT count(*) FROM chunks WHERE document_id LIKE 'crash-%'"
        ).fetchone() == (0,)
        assert connection.execute(
            "SELECT count(*) FROM crash_test_rows WHERE document_id LIKE 'crash-%'"
        ).fetchone() == (0,)
    finally:
        connection.close()


def test_killed_inside_the_write_transaction_keeps_the_prior_ingest_and_adds_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    database = data / DATABASE
    prior = Worker("tests.worker.crash_worker", data, tmp_path / "unused.json")
    try:
        assert prior.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})["success"]
    finally:
        prior.stop()
    before = table_digests(database)

    kill_inside_the_write(data, tmp_path, "docs", [*CRASH_DOCUMENTS, REPLACED_ASPIRIN])

    assert_intact(database)
    # All or nothing, table by table: documents, chunks, FTS5 keyword tables, every technique index.
    assert table_digests(database) == before
    after = Worker("iris_rag.bridge", data)
    try:
        collections = after.call("list_collections")["result"]["collections"]
        assert [(c["id"], c["document_count"]) for c in collections] == [("docs", 3)]
        answer = after.call(
            "execute",
            {"technique": "basic", "arguments": {"query": "aspirin heart attack", "collection_id": "docs"}},
        )
        top = answer["result"]["retrieved_documents"][0]
        assert top["id"] == "aspirin"
        assert "zeolite" not in top["content"].lower(), "the killed replacement did not land"
    finally:
        after.stop()


def test_killed_inside_the_first_ingest_leaves_no_collection_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    database = data / DATABASE
    opened = Worker("tests.worker.crash_worker", data, tmp_path / "unused.json")
    try:
        assert opened.call("list_collections")["result"]["collections"] == []
    finally:
        opened.stop()
    before = table_digests(database)

    kill_inside_the_write(data, tmp_path, "fresh", CRASH_DOCUMENTS)

    assert_intact(database)
    connection = sqlite3.connect(database)
    try:
        assert connection.execute("SELECT id FROM collections").fetchall() == [], "no empty collection left"
    finally:
        connection.close()
    assert table_digests(database) == before
