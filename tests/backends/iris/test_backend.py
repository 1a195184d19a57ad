"""RAG_STORE=iris without a server: settings, secrets, refusal when IRIS is unreachable, SQL hygiene, filters.

No IRIS server runs on these machines, so what needs one (the contract suite, the MCP end-to-end test, the
eval) runs only where IRIS_HOST is set and is skipped with that reason here. What can be checked without one
is checked here, on the real code: the settings and their validation, the password kept out of every
message, a bounded and clear refusal when nothing answers, every statement built from parameters, and the
metadata filter (evaluated in Python on IRIS) giving the same documents as the PostgreSQL store's SQL.
"""

from __future__ import annotations

import ast
import socket
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from iris_rag.backends import create_store
from iris_rag.backends.iris import schema
from iris_rag.backends.iris.filters import matches
from iris_rag.backends.iris.store import IrisConnectionError, IrisTarget, connect, vector_literal
from iris_rag.redaction import redact
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import ChunkInput, DocumentInput, NewCollection
from iris_rag.stores.filters import parse_filters

IRIS_PACKAGE = Path(__file__).resolve().parents[3] / "iris_rag" / "backends" / "iris"


def test_iris_needs_a_host(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="RAG_STORE=iris needs IRIS_HOST"):
        Settings(RAG_STORE="iris", RAG_DATA_DIR=tmp_path)


def test_the_seed_settings_and_their_defaults(tmp_path: Path) -> None:
    settings = Settings(RAG_STORE="iris", IRIS_HOST="iris.example", RAG_DATA_DIR=tmp_path)
    assert (settings.iris_port, settings.iris_namespace, settings.iris_username) == (1972, "USER", "_SYSTEM")
    assert settings.iris_connect_timeout_s == 10.0
    with pytest.raises(ValidationError):
        Settings(RAG_STORE="iris", IRIS_HOST="h", IRIS_PORT="70000", RAG_DATA_DIR=tmp_path)


def test_the_password_is_a_secret(tmp_path: Path) -> None:
    settings = Settings(RAG_STORE="iris", IRIS_HOST="h", IRIS_PASSWORD="Sup3rSecret!", RAG_DATA_DIR=tmp_path)
    assert "Sup3rSecret!" not in repr(settings)
    assert "Sup3rSecret!" in settings.llm_secrets
    assert redact("login failed for Sup3rSecret!", settings.llm_secrets) == "login failed for ***"
    target = IrisTarget("h", 1972, "USER", "_SYSTEM", "Sup3rSecret!")
    assert "Sup3rSecret!" not in target.describe() and "Sup3rSecret!" not in repr(target.describe())


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_server_that_is_not_there_is_refused_at_once_by_name(tmp_path: Path) -> None:
    port = _closed_port()
    settings = Settings(
        RAG_STORE="iris",
        IRIS_HOST="127.0.0.1",
        IRIS_PORT=str(port),
        IRIS_PASSWORD="Sup3rSecret!",
        RAG_DATA_DIR=tmp_path,
    )
    started = time.monotonic()
    with pytest.raises(IrisConnectionError) as refused:
        RagService(settings)
    assert time.monotonic() - started < 5
    message = str(refused.value)
    assert f"cannot reach IRIS at 127.0.0.1:{port}" in message and "IRIS_HOST and IRIS_PORT" in message
    assert "Sup3rSecret!" not in message


def test_create_store_builds_the_iris_store_lazily(tmp_path: Path) -> None:
    """The factory reaches the IRIS store only for RAG_STORE=iris, and its failure names the server."""
    settings = Settings(
        RAG_STORE="iris", IRIS_HOST="127.0.0.1", IRIS_PORT=str(_closed_port()), RAG_DATA_DIR=tmp_path
    )
    with pytest.raises(IrisConnectionError, match="cannot reach IRIS") as refused:
        create_store(settings)
    assert refused.value.code == "DATABASE_CONNECTION_FAILED"


# Names an f-string in a statement may interpolate: identifiers from the schema module, integers, and the
# placeholder list. Anything else (a collection id, a term, a value) would be string-formatted SQL.
# `statement` is the parameter of the store's own execute/rows wrappers (whose callers are checked here) or a
# loop over the schema module's constant DDL.
_ALLOWED_NAMES = {"table", "expression", "statement"}
_ALLOWED_CALLS = {"vector_table", "_marks", "int"}
_SQL_METHODS = {"execute", "executemany", "rows"}


def _allowed(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):  # or a module constant (upper case): column lists, DDL
        return node.id in _ALLOWED_NAMES or node.id.lstrip("_").isupper()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in _ALLOWED_CALLS
    if isinstance(node, ast.Attribute):  # self._CHUNK_SELECT: a constant of the class
        return node.attr.isupper() or node.attr == "_CHUNK_SELECT"
    if isinstance(node, ast.BinOp):
        return _allowed(node.left) and _allowed(node.right)
    return False


def _statement_ok(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return all(
            isinstance(part, ast.Constant) or (isinstance(part, ast.FormattedValue) and _allowed(part.value))
            for part in node.values
        )
    if isinstance(node, ast.BinOp):
        return _statement_ok(node.left) and _statement_ok(node.right)
    return _allowed(node)


def test_every_statement_is_built_from_parameters_never_from_values() -> None:
    checked = 0
    offenders = []
    for module in sorted(IRIS_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _SQL_METHODS
                and node.args
            ):
                checked += 1
                if not _statement_ok(node.args[0]):
                    offenders.append(f"{module.name}:{node.lineno}: {ast.unparse(node.args[0])[:80]}")
    assert checked > 40, checked  # the walk found the store's statements
    assert offenders == []


def test_the_static_check_catches_a_formatted_value() -> None:
    bad = ast.parse("self.rows(f\"SELECT 1 FROM t WHERE id = '{collection_id}'\")").body[0]
    assert isinstance(bad, ast.Expr) and isinstance(bad.value, ast.Call)
    assert not _statement_ok(bad.value.args[0])
    good = ast.parse('self.rows(f"SELECT 1 FROM {SCHEMA}.T WHERE id IN ({_marks(len(b))})", b)').body[0]
    assert isinstance(good, ast.Expr) and isinstance(good.value, ast.Call)
    assert _statement_ok(good.value.args[0])


def test_the_schema_is_iris_sql_for_vectors_and_hnsw() -> None:
    ddl = schema.vector_table_ddl(384)
    assert "embedding     VECTOR(FLOAT, 384) NOT NULL" in ddl[0]
    assert (
        ddl[-1] == "CREATE INDEX HnswCosine384 ON IrisRag.Vectors384 (embedding) AS HNSW(Distance='Cosine')"
    )
    with pytest.raises(ValueError, match="dimension"):
        schema.vector_table(0)
    statements = [s for _, _, step in schema.MIGRATIONS for s in step]
    kinds = ("CREATE TABLE IrisRag.", "ALTER TABLE IrisRag.", "CREATE INDEX ", "CREATE UNIQUE INDEX ")
    assert all(
        s.startswith((*kinds, "UPDATE IrisRag.", "BUILD INDEX FOR TABLE IrisRag.")) for s in statements
    )
    # Every id, term and name column compares as written once step 6 ran (SQLUPPER ignores case).
    assert "collection_id VARCHAR(512) COLLATE EXACT NOT NULL" in ddl[0]
    assert all(";" not in s for s in statements)  # one statement per execute: the driver runs one


def test_vector_literals_round_trip_float32_exactly() -> None:
    import numpy as np

    vector = np.random.default_rng(3).standard_normal(384).astype(np.float32)
    text = vector_literal(vector)
    assert np.array_equal(np.asarray([float(x) for x in text.split(",")], dtype=np.float32), vector)


FILTER_DOCUMENTS = [
    ("a", {"year": 2020, "topic": "food", "published": "2020-05-01", "flag": True}),
    ("b", {"year": 2020.0, "topic": "geology", "published": "2021-01-10", "years": [2019, 2024]}),
    ("c", {"year": "2020", "topic": ["food", "x"], "flag": 1}),
    ("d", {"year": 2023, "published": "2019-12-31T10:00:00", "nested": {"k": 1}}),
    ("e", {}),
]
FILTERS = [
    {"year": 2020},
    {"year": "2020"},
    {"flag": True},
    {"flag": 1},
    {"topic": {"in": ["food", "geology"]}},
    {"year": {"gte": 2020, "lt": 2023}},
    {"year": {"gt": 2020}},
    {"published": {"gte": "2020-01-01"}},
    {"published": {"lt": "2020-01-01"}},
    {"nested": {"in": [{"k": 1}]}},
    {"year": 2020, "topic": "food"},
    {"missing": 1},
    # A list matches when one element does; a field's range bounds must hold on the same element.
    {"topic": "x"},
    {"topic": {"in": ["x", "geology"]}},
    {"years": 2024},
    {"years": {"gte": 2024}},
    {"years": {"gt": 2020, "lt": 2023}},
    {"nested": 1},
]


@pytest.mark.parametrize("raw", FILTERS, ids=[str(f) for f in FILTERS])
def test_filters_select_what_the_postgres_store_selects(raw: dict[str, object], postgres_url: str) -> None:
    """IRIS tests metadata in Python; PostgreSQL's JSONB SQL is the reference for what a filter means."""
    import numpy as np

    from iris_rag.backends.postgres.store import PostgresStore

    store = PostgresStore(postgres_url, max_connections=2)
    try:
        vector = np.full(4, 0.5, dtype=np.float32)
        documents = [
            DocumentInput(d, d, f"text {d}", metadata, [ChunkInput(0, f"text {d}", 0, 6, vector)])
            for d, metadata in FILTER_DOCUMENTS
        ]
        store.upsert_documents("c", documents, new_collection=NewCollection("m", 4))
        parsed = parse_filters(raw)
        assert parsed is not None
        expected = store.matching_document_ids("c", parsed)
        assert {d for d, metadata in FILTER_DOCUMENTS if matches(metadata, parsed)} == expected
    finally:
        store.close()


def test_the_health_component_is_named_iris_database_on_iris(service: RagService) -> None:
    """The naming rule, on a SQLite service whose store reports itself as IRIS (no IRIS server here)."""
    assert "database" in service.health_check({})["components"]
    service.store.backend_name = "iris"  # the one attribute the rule reads
    components = service.health_check({})["components"]
    assert "iris_database" in components and "database" not in components


def test_the_techniques_iris_stores_and_the_ones_it_refuses() -> None:
    from iris_rag.backends.iris import TECHNIQUE_STORAGE, noderag
    from iris_rag.techniques.colbert.storage import TokenVectorStorage
    from iris_rag.techniques.noderag.storage import NODE_COLUMNS, NodeTreeStorage

    assert set(TECHNIQUE_STORAGE) == {TokenVectorStorage, NodeTreeStorage}
    # NodeRAG's columns, under IRIS-safe names, in NODE_COLUMNS' order.
    assert len(noderag._COLUMNS.split(", ")) == len(NODE_COLUMNS)


def test_without_the_driver_the_refusal_says_which_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers, and no intersystems-irispython installed (the iris extra)."""
    monkeypatch.setitem(sys.modules, "iris", None)  # `import iris` raises ImportError
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        target = IrisTarget("127.0.0.1", int(listener.getsockname()[1]), password="Sup3rSecret!")
        with pytest.raises(IrisConnectionError, match=r"pip install 'iris-rag\[iris\]'"):
            connect(target)
