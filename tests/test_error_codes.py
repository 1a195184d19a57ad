"""Every error code the worker can send has a front-end hint, and the spec's codes come from real causes."""

from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from iris_rag import errors
from iris_rag.backends import create_store
from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.embedder import Embedder
from iris_rag.errors import (
    DatabaseConnectionFailedError,
    InvalidParametersError,
    InvalidQueryError,
    MissingRequiredFieldError,
)
from iris_rag.service import RagService
from iris_rag.settings import Settings, default_data_dir
from iris_rag.validation import validate_arguments
from iris_rag.worker.dispatch import Dispatcher
from tests.conftest import DOCUMENTS, SAMPLE_CORPUS
from tests.fake_openai import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]


def worker_codes() -> set[str]:
    return {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.RagError) and cls is not errors.RagError
    }


def test_every_worker_error_code_has_a_front_end_hint() -> None:
    source = (ROOT / "mcp-server" / "src" / "errors.ts").read_text()
    hinted = set(re.findall(r"^\s+([A-Z_]+):", source, flags=re.MULTILINE))
    missing = worker_codes() - hinted
    assert not missing, f"add hints for {sorted(missing)} to mcp-server/src/errors.ts"


# The spec's codes with a real cause here (issue 16 item 8), each raised by its real cause.


def test_a_missing_required_argument_is_missing_required_field() -> None:
    with pytest.raises(MissingRequiredFieldError) as basic:
        validate_arguments("rag_basic", {"options": {"top_k": 3}})
    assert basic.value.details["missing"] == ["/query"]
    with pytest.raises(MissingRequiredFieldError) as nested:
        validate_arguments("rag_ingest", {"collection_id": "c", "documents": [{"title": "no content"}]})
    assert nested.value.details["missing"] == ["/documents/0/content"]
    # A missing field beside a wrong one: the wrong one decides, as before.
    with pytest.raises(InvalidParametersError):
        validate_arguments("rag_get_document", {"collection_id": 7})
    with pytest.raises(InvalidQueryError):
        validate_arguments("rag_basic", {"query": ""})


def test_an_unreachable_llm_is_llm_service_unavailable_with_the_documents(
    tmp_path: Path, embedder: Embedder
) -> None:
    fake = FakeOpenAIServer()
    fake.close()  # nothing listens on its port any more
    settings = Settings(
        RAG_DATA_DIR=tmp_path,
        LLM_PROVIDER="openai",
        LLM_MODEL="fake-model",
        LLM_API_KEY="sk-unreachable-secret",
        LLM_BASE_URL=fake.base_url,
        LLM_MAX_RETRIES=0,
        LLM_TIMEOUT_S=5,
    )
    service = RagService(settings, embedder=embedder)
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        ok, error = Dispatcher(service).call(
            "execute", {"technique": "basic", "arguments": {"query": "aspirin", "collection_id": "docs"}}
        )
        assert not ok
        assert error["code"] == "LLM_SERVICE_UNAVAILABLE", error
        assert "cannot be reached" in error["message"]
        partial = error["details"]["partial_result"]
        assert partial["retrieved_documents"][0]["id"] == "aspirin"
        assert "sk-unreachable-secret" not in json.dumps(error)
    finally:
        service.close()


def test_a_model_that_cannot_load_is_embedding_service_unavailable(tmp_path: Path) -> None:
    broken = Embedder(str(tmp_path / "no-such-model"))
    broken.load()
    service = RagService(Settings(RAG_DATA_DIR=tmp_path), embedder=broken)
    try:
        ok, error = Dispatcher(service).call(
            "ingest", {"collection_id": "c", "documents": [{"content": "some text"}]}
        )
        assert not ok and error["code"] == "EMBEDDING_SERVICE_UNAVAILABLE", error
        assert "no-such-model" in error["message"]
    finally:
        service.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_postgres_at_start_is_database_connection_failed(tmp_path: Path) -> None:
    url = f"postgresql://rag:pg-secret-pw@127.0.0.1:{_closed_port()}/rag"
    settings = Settings(RAG_DATA_DIR=tmp_path, RAG_STORE="postgres", RAG_POSTGRES_URL=url)
    started = time.monotonic()
    with pytest.raises(DatabaseConnectionFailedError) as failure:
        create_store(settings)
    assert time.monotonic() - started < 15, "refused at once, not after the pool's 30 s wait"
    assert "pg-secret-pw" not in json.dumps(failure.value.to_dict())


def test_a_postgres_server_lost_during_calls_is_database_connection_failed(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> None:
    """A private server (the session's is shared), stopped under a running service."""
    from pgserver import get_server  # type: ignore[attr-defined]  # re-exported without __all__

    try:
        server = get_server(tmp_path_factory.mktemp("lost-postgres"), cleanup_mode="stop")
    except Exception:  # as tests/conftest.py: a first start on a loaded machine fails now and then
        server = get_server(tmp_path_factory.mktemp("lost-postgres"), cleanup_mode="stop")
    settings = Settings(RAG_DATA_DIR=tmp_path, RAG_STORE="postgres", RAG_POSTGRES_URL=str(server.get_uri()))
    service = RagService(settings, embedder=embedder)
    dispatcher = Dispatcher(service)
    try:
        assert dispatcher.call("list_collections", {})[0]
        server.cleanup()  # stops PostgreSQL
        # The thread's connection breaks at once; a later call waits for the pool (30 s) before it fails.
        ok, error = dispatcher.call(
            "execute", {"technique": "basic", "arguments": {"query": "q", "collection_id": "c"}}
        )
        assert not ok and error["code"] == "DATABASE_CONNECTION_FAILED", error
        assert "PostgreSQL server cannot be reached" in error["message"]
    finally:
        service.close()


def test_the_command_line_names_an_unreachable_database_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from iris_rag.cli import main

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RAG_STORE", "postgres")
    monkeypatch.setenv("RAG_POSTGRES_URL", f"postgresql://rag:cli-secret-pw@127.0.0.1:{_closed_port()}/rag")
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error DATABASE_CONNECTION_FAILED: ") and "cli-secret-pw" not in error
    assert "Traceback" not in error


@pytest.mark.parametrize(
    ("url", "said"),
    [
        # an unclosed IPv6 bracket: urlsplit raises ValueError
        ("postgresql://rag:TopSecretPw42@[::1/rag", "is not a valid PostgreSQL URL"),
        # one character mistyped: the driver quotes the whole value ('missing "=" after "postgres//..."')
        ("postgres//rag:TopSecretPw42@127.0.0.1:1/rag", "is not a valid PostgreSQL URL"),
        ("postgresql:/rag:TopSecretPw42@127.0.0.1:1/rag", "is not a valid PostgreSQL URL"),
        ("rag:TopSecretPw42@127.0.0.1:1/rag", "is not a valid PostgreSQL URL"),
        # an unencoded @ in the password: the driver cuts at the first one and names the host 'cretPw42@...'
        ("postgresql://rag:TopSe@cretPw42@127.0.0.1:1/rag", "cannot be reached"),
        # an unencoded / in it: the driver reads 'rag:TopSe' as host and port
        ("postgresql://rag:TopSe/cretPw42@127.0.0.1:1/rag", "cannot be reached"),
    ],
    ids=["bracket", "no-colon", "one-slash", "no-scheme", "at-in-password", "slash-in-password"],
)
def test_a_malformed_postgres_url_is_named_without_its_password(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    url: str,
    said: str,
) -> None:
    from iris_rag.cli import main

    pieces = ("TopSecretPw42", "TopSe@cretPw42", "TopSe/cretPw42", "cretPw42", "TopSe")
    settings = Settings(RAG_DATA_DIR=tmp_path, RAG_STORE="postgres", RAG_POSTGRES_URL=url)
    with pytest.raises(DatabaseConnectionFailedError, match=said) as failure:
        create_store(settings)
    message = json.dumps(failure.value.to_dict())
    assert not [piece for piece in pieces if piece in message], message
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RAG_STORE", "postgres")
    monkeypatch.setenv("RAG_POSTGRES_URL", url)
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error DATABASE_CONNECTION_FAILED: ") and "Traceback" not in error
    assert not [piece for piece in pieces if piece in error + caplog.text], error


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        (
            {"CHUNK_SIZE": "500", "CHUNK_OVERLAP": "600"},
            "CHUNK_OVERLAP (600) must be smaller than CHUNK_SIZE (500)",
        ),
        ({"CHUNK_SIZE": "abc"}, "CHUNK_SIZE: Input should be a valid integer"),
        ({"RAG_STORE": "mongo"}, "RAG_STORE: Input should be 'sqlite', 'postgres' or 'iris'"),
        ({"WORKER_THREADS": "0"}, "WORKER_THREADS: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable_and_no_secret(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    environment: dict[str, str],
    named: str,
) -> None:
    from iris_rag.cli import main

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LLM_API_KEY", "sk-" + "A" * 40 + "-TAILsecret9876")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: invalid configuration: ") and named in error
    assert "TAILsecret9876" not in error and "Traceback" not in error and len(error.splitlines()) == 1


def test_an_empty_data_dir_setting_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_DATA_DIR", "")
    assert Settings().data_dir == default_data_dir() != Path()


def test_a_data_dir_that_cannot_hold_the_store_is_named_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from iris_rag.cli import main

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file where the data folder should be", encoding="utf-8")
    with pytest.raises(DatabaseConnectionFailedError, match="RAG_DATA_DIR must be a folder"):
        create_store(Settings(RAG_DATA_DIR=not_a_folder))
    monkeypatch.setenv("RAG_DATA_DIR", str(not_a_folder / "below"))
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith("error DATABASE_CONNECTION_FAILED: the SQLite store ") and "Traceback" not in error
    )


def _scifact(count: int) -> list[dict[str, object]]:
    lines = SAMPLE_CORPUS.read_text(encoding="utf-8").splitlines()[:count]
    return [{"id": d["_id"], "title": d["title"], "content": d["text"]} for d in map(json.loads, lines)]


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        # A full disk, as SQLite says it (a file-size limit, ulimit -f, says "disk I/O error": SQLITE_IOERR).
        ("PRAGMA max_page_count = {pages}", "database or disk is full"),
        ("PRAGMA query_only = 1", "attempt to write a readonly database"),
    ],
    ids=["full", "read-only"],
)
def test_a_sqlite_store_that_cannot_be_written_is_database_connection_failed(
    tmp_path: Path, embedder: Embedder, limit: str, said: str
) -> None:
    """The operator's to fix (the README's RAG_DATA_DIR the store cannot write), not a bug: no traceback."""
    service = RagService(Settings(RAG_DATA_DIR=tmp_path), embedder=embedder)
    dispatcher = Dispatcher(service)
    try:
        assert dispatcher.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})[0]
        # The calling thread's connection: the dispatcher runs the call on it.
        connection = sqlite_connection(service.store)
        connection.execute(limit.format(pages=connection.execute("PRAGMA page_count").fetchone()[0]))
        for collection in ("docs", "new"):
            ok, error = dispatcher.call("ingest", {"collection_id": collection, "documents": _scifact(40)})
            assert not ok and error["code"] == "DATABASE_CONNECTION_FAILED", error
            assert said in error["message"] and "RAG_DATA_DIR" in error["message"], error
        # Nothing half-written: the ingest went whole or not at all.
        assert [(c.id, c.document_count) for c in service.store.list_collections()] == [("docs", 3)]
    finally:
        service.close()


@pytest.mark.parametrize("damage", ["truncated", "not-a-database"])
def test_a_damaged_sqlite_file_is_named_as_damaged_and_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    from iris_rag.cli import main

    settings = Settings(RAG_DATA_DIR=tmp_path)
    path = settings.database_path
    if damage == "truncated":  # the schema's pages cut off
        create_store(settings).close()
        with path.open("r+b") as file:
            file.truncate(4096)
    else:
        path.write_text("notes that were never a database\n" * 200, encoding="utf-8")
    before = path.read_bytes()
    with pytest.raises(DatabaseConnectionFailedError) as failure:
        create_store(settings)
    message = failure.value.message
    assert "damaged or not an iris-rag database" in message and "restore it from a backup" in message
    assert "must be a folder" not in message
    assert path.read_bytes() == before  # never repaired, emptied or deleted by opening
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    assert main(["health", "--quick"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error DATABASE_CONNECTION_FAILED: the SQLite store ") and "damaged" in error
    assert "Traceback" not in error and len(error.splitlines()) == 1


def test_a_sqlite_file_removed_under_the_running_service_makes_the_database_unhealthy(
    tmp_path: Path, embedder: Embedder
) -> None:
    service = RagService(Settings(RAG_DATA_DIR=tmp_path), embedder=embedder)
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        assert service.health_check({})["components"]["database"]["status"] == "healthy"
        for file in tmp_path.glob("iris_rag.sqlite3*"):
            file.unlink()
        database = service.health_check({})["components"]["database"]
        assert database["status"] == "unhealthy" and "removed or replaced" in database["error_message"]
        # A call on a thread new to the store: refused, not served from an empty file made at the path.
        with ThreadPoolExecutor(1) as thread:
            ok, error = thread.submit(Dispatcher(service).call, "list_collections", {}).result()
        assert not ok and error["code"] == "DATABASE_CONNECTION_FAILED", error
        assert not service.settings.database_path.exists()
        create_store(service.settings).close()  # another file now where the store was (a restore, say)
        database = service.health_check({})["components"]["database"]
        assert database["status"] == "unhealthy" and "restart" in database["error_message"]
    finally:
        service.close()
