"""The `iris-rag` command exits with its own status whatever the embedding model's threads are doing.

Every command below waits for the model and then finishes within milliseconds, while the encode thread is
still in C++ right after the load (building the query thread's copy of the model). A daemon thread caught
there at interpreter exit used to end the process with `terminate called without an active exception`
(SIGABRT, status 134) instead of the command's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from iris_rag.embedder import EncodeQueue, Priority
from iris_rag.errors import ModelUnavailableError
from tests.conftest import DOCUMENTS, ROOT

ABORTED = "terminate called"


def _run(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "RAG_DATA_DIR": str(data_dir),
        "RAG_TECHNIQUES": "basic",
        "LOG_LEVEL": "WARNING",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "iris_rag.cli", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _exits(done: subprocess.CompletedProcess[str], *statuses: int) -> None:
    assert ABORTED not in done.stderr, done.stderr
    assert done.returncode in statuses, (done.returncode, done.stderr[-2000:])


@pytest.fixture
def documents(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"".join(orjson.dumps(document) + b"\n" for document in DOCUMENTS))
    return path


def test_commands_exit_with_their_status_right_after_the_model_loads(tmp_path: Path, documents: Path) -> None:
    data = tmp_path / "data"
    _exits(_run(data, "ingest", str(documents), "--collection", "c"), 0)
    _exits(_run(data, "ingest", str(documents), "--collection", "c"), 0)  # nothing new: ends at once
    done = _run(data, "query", "volcano lava", "--collection", "c", "--no-generate")
    _exits(done, 0)
    assert orjson.loads(done.stdout)["success"] is True
    # A failing command's status: the CLI's error statuses are 1 (some input failed) and 2 (an error code).
    missing = _run(data, "query", "anything", "--collection", "nope", "--no-generate")
    _exits(missing, 1, 2)
    assert "COLLECTION_NOT_FOUND" in missing.stderr
    _exits(_run(data, "ingest", str(tmp_path / "nonexistent"), "--collection", "c"), 1)


def test_a_torch_command_exits_with_its_status_right_after_the_model_loads(tmp_path: Path) -> None:
    """Under torch the encode thread deep-copies the model for the query thread after the load."""
    missing = _run(tmp_path / "data", "query", "anything", "--collection", "nope", EMBEDDING_BACKEND="torch")
    _exits(missing, 1, 2)
    assert "COLLECTION_NOT_FOUND" in missing.stderr


def test_closing_an_encode_queue_finishes_the_running_task_and_cancels_the_queued_ones() -> None:
    """What the exit does for every embedder (iris_rag.embedder._finish_model_work_at_exit)."""
    encode = EncodeQueue("test-encode")
    started, release = threading.Event(), threading.Event()

    def running_task() -> str:
        started.set()
        release.wait(10)
        return "done"

    running = encode.submit(Priority.URGENT, running_task)
    queued = encode.submit(Priority.BULK, lambda: "never")
    assert started.wait(10)
    assert not encode.close(timeout=0.05), "still running: a bounded wait says so"
    release.set()
    assert encode.close(timeout=10)
    assert running.result() == "done"
    assert queued.cancelled()
    with pytest.raises(ModelUnavailableError):
        encode.submit(Priority.URGENT, lambda: "too late").result()
