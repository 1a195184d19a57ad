"""One store per test for every backend: each contract test runs once per backend (-k sqlite, iris-double...).

Every store is built the way the service builds it, by iris_rag.backends.create_store from Settings, so
the suite exercises exactly what RAG_STORE selects. Tests use only the DocumentStore protocol (no SQL, no
backend internals). A new backend is one more entry in BACKENDS and one more branch of `backend`.

"iris-double" is not a backend but the IRIS store on a test double of its driver
(tests/backends/iris/iris_double.py: SQLite under IRIS's documented rules), so that every contract test runs
the IRIS store's own Python and SQL where no IRIS server is; "iris" is a live server (IRIS_HOST).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from iris_rag.backends import create_store
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentStore
from tests.backends.iris.iris_double import install, listening_port
from tests.conftest import iris_env


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend under test: how to configure it, and what its dense search promises."""

    name: str
    # RAG_* variables selecting this backend's store (a subprocess or a second service gets the same store).
    env: dict[str, str]
    # Rows in the recall fixture: enough for the backend to search with its ANN index, if it has one.
    ann_rows: int
    # An exact backend must find every true neighbour; an approximate one at least this share of them.
    min_recall: float

    def settings(self, **overrides: Any) -> Settings:
        """Settings selecting this backend's store, with other settings as given."""
        return Settings(**{**self.env, **overrides})


IRIS_DOUBLE = "iris-double"
BACKENDS = ["sqlite", "postgres", "iris", IRIS_DOUBLE]
# The techniques IRIS serves (README, Stores): a service on IRIS refuses to start with the others.
IRIS_TECHNIQUES = {"RAG_TECHNIQUES": "basic,hyde,hybrid_ifind,crag,colbert,noderag"}


@pytest.fixture
def iris_double_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The port of an IRIS test double installed for this test (its data in a new SQLite file)."""
    install(tmp_path / "iris-double.sqlite3", monkeypatch)
    with listening_port() as port:
        yield port


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The backend of this run of the test; postgres gets a fresh database on the session's server."""
    data_dir = str(tmp_path / "data")
    if request.param == "sqlite":
        # SQLite searches exactly, whatever the size.
        return Backend("sqlite", {"RAG_DATA_DIR": data_dir}, ann_rows=2_000, min_recall=1.0)
    if request.param == "iris":
        env = {"RAG_DATA_DIR": data_dir, **iris_env(), **IRIS_TECHNIQUES}
        return Backend("iris", env, ann_rows=5_000, min_recall=0.95)  # past EXACT_SEARCH_MAX_CHUNKS: HNSW
    if request.param == IRIS_DOUBLE:
        port: int = request.getfixturevalue("iris_double_port")
        env = {
            "RAG_DATA_DIR": data_dir,
            "RAG_STORE": "iris",
            "IRIS_HOST": "127.0.0.1",
            "IRIS_PORT": str(port),
            **IRIS_TECHNIQUES,
        }
        # Past EXACT_SEARCH_MAX_CHUNKS the store queries its HNSW index, which the double searches exactly.
        return Backend(IRIS_DOUBLE, env, ann_rows=5_000, min_recall=1.0)
    url: str = request.getfixturevalue("postgres_url")
    env = {"RAG_DATA_DIR": data_dir, "RAG_STORE": "postgres", "RAG_POSTGRES_URL": url}
    return Backend("postgres", env, ann_rows=5_000, min_recall=0.95)  # past EXACT_SEARCH_MAX_CHUNKS: HNSW


@pytest.fixture
def make_store(backend: Backend) -> Iterator[Callable[[], DocumentStore]]:
    """Open further stores on the backend's data (another process's view); all closed after the test."""
    opened: list[DocumentStore] = []

    def open_store() -> DocumentStore:
        store = create_store(backend.settings())
        if backend.name == "iris" and not opened:
            # A live server keeps its rows between tests: each test starts on an empty store.
            for collection in store.list_collections():
                store.delete_collection(collection.id)
        opened.append(store)
        return store

    yield open_store
    for store in reversed(opened):
        store.close()


@pytest.fixture
def store(make_store: Callable[[], DocumentStore]) -> DocumentStore:
    """A store on an empty database of the backend under test."""
    return make_store()
