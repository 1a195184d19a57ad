"""The SQL guard: hostile statements are rejected or contained; the database file stays byte-identical."""

import hashlib
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from iris_rag.backends.sqlite.sqlrag import execute_readonly, readonly_connection
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.errors import RequestCancelledError, SqlRejectedError
from iris_rag.service import RagService
from iris_rag.techniques.sqlrag import safety
from iris_rag.techniques.sqlrag.pipeline import SqlRagPipeline
from iris_rag.techniques.sqlrag.safety import check_sql, select_limits
from iris_rag.techniques.sqlrag.storage import CheckedSql
from tests.conftest import DOCUMENTS

SALES = [
    {"region": "north", "amount": 10.5, "sold_on": "2024-01-02"},
    {"region": "south", "amount": 7, "sold_on": "2024-02-03"},
    {"region": "north", "amount": 3, "sold_on": "2024-03-01"},
]
EVIL_FILES = [Path("/tmp/iris-rag-evil.db"), Path("/tmp/iris-rag-evil.txt"), Path("/tmp/iris-rag-copy.db")]
SECRETS = ("low-dose", "VAULT-SECRET", "CREATE TABLE")


@pytest.fixture
def guarded(service: RagService) -> RagService:
    """Collection 'docs' with table t_sales; collection 'vault' with table t_vault (out of docs' scope)."""
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    vault = {"id": "v", "content": "VAULT-SECRET: the launch code is 0000.", "metadata": {"level": 9}}
    service.ingest({"collection_id": "vault", "documents": [vault]})
    pipeline = service.pipelines["sqlrag"]
    assert isinstance(pipeline, SqlRagPipeline)
    pipeline.ingest_table({"table": "sales", "collection_id": "docs", "rows": SALES})
    pipeline.ingest_table({"table": "vault", "collection_id": "vault", "rows": [{"code": "VAULT-SECRET"}]})
    pipeline.table_schema({})  # builds every documents view now, so the file is settled before hashing
    return service


def run_sql(service: RagService, sql: str, **params: Any) -> dict[str, Any]:
    arguments = {
        "query": "q",
        "collection_id": "docs",
        "options": {"generate": False, "top_k": 1},
        "technique_params": {"sql": sql, "combine_with_vector": False, **params},
    }
    return service.execute({"technique": "sqlrag", "arguments": arguments})


def sqlite_file(service: RagService) -> sqlite3.Connection:
    """The store's own connection, for checks of what the SQLite file really holds."""
    store = service.store
    assert isinstance(store, SqliteStore)
    return store.connection()


def file_digest(service: RagService) -> str:
    """SHA-256 of the database file after moving everything in the WAL into it."""
    sqlite_file(service).execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return hashlib.sha256(service.settings.database_path.read_bytes()).hexdigest()


COMPLEX = {"max_sql_complexity": "complex"}
LONG_LIKE = "%a" * 3000
# Each must come back SQL_REJECTED (at parse, check or execution).
HOSTILE: list[tuple[str, dict[str, Any]]] = [
    # Stacked statements, also hidden behind comments
    ("SELECT 1; DROP TABLE t_sales", {}),
    ("SELECT * FROM t_sales; DELETE FROM t_sales", {}),
    ("SELECT * FROM t_sales /* x */; DROP TABLE t_sales", {}),
    ("SELECT * FROM t_sales -- hidden\n; DELETE FROM t_sales", {}),
    ("SELECT * FROM t_sales; -- x\nATTACH DATABASE '/tmp/iris-rag-evil.db' AS evil", {}),
    ("SELECT 1; SELECT 2", {}),
    # Writes and DDL
    ("DROP TABLE t_sales", {}),
    ("DELETE FROM t_sales", {}),
    ("UPDATE t_sales SET amount = 0", {}),
    ("INSERT INTO t_sales (region) VALUES ('x')", {}),
    ("INSERT INTO t_sales SELECT * FROM t_sales", {}),
    ("REPLACE INTO t_sales (region) VALUES ('x')", {}),
    ("CREATE TABLE evil (x)", {}),
    ("CREATE TEMP VIEW v AS SELECT 1", {}),
    ("CREATE TRIGGER t AFTER INSERT ON t_sales BEGIN DELETE FROM t_sales; END", {}),
    ("ALTER TABLE t_sales ADD COLUMN x INTEGER", {}),
    ("ALTER TABLE t_sales RENAME TO t_gone", {}),
    ("SELECT * INTO evil FROM t_sales", {}),
    # Outside the query: files, pragmas, transactions, maintenance
    ("ATTACH DATABASE '/tmp/iris-rag-evil.db' AS evil", {}),
    ("DETACH DATABASE main", {}),
    ("PRAGMA writable_schema = ON", {}),
    ("PRAGMA table_info(documents)", {}),
    ("PRAGMA query_only = OFF", {}),
    ("VACUUM", {}),
    ("VACUUM INTO '/tmp/iris-rag-copy.db'", {}),
    ("BEGIN IMMEDIATE", {}),
    ("COMMIT", {}),
    ("ANALYZE", {}),
    ("REINDEX", {}),
    ("EXPLAIN SELECT * FROM documents", {}),
    # The store's internal tables, directly, by alias, quoting, case or schema name
    ("SELECT * FROM documents", {}),
    ("SELECT * FROM chunks", {}),
    ("SELECT * FROM embedding_cache", {}),
    ("SELECT * FROM calls", {}),
    ("SELECT * FROM collections", {}),
    ("SELECT * FROM structured_tables", {}),
    ("SELECT * FROM sqlite_master", {}),
    ("SELECT * FROM sqlite_schema", {}),
    ("SELECT * FROM sqlite_temp_master", {}),
    ('SELECT * FROM "fts_docs"', {}),
    ("SELECT * FROM vocab_docs", {}),
    ("SELECT * FROM main.documents", {}),
    ("SELECT * FROM temp.t_sales", {}),
    ("SELECT * FROM [documents]", {}),
    ("SELECT * FROM DOCUMENTS", {}),
    ("SELECT * FROM t_sales AS documents, documents", {}),
    ("SELECT * FROM document\u0455", {}),  # ends in a Cyrillic 's'
    # ... by subquery, join, CTE, set operation
    ("SELECT (SELECT count(*) FROM documents) FROM t_sales", {}),
    ("SELECT * FROM t_sales WHERE region IN (SELECT id FROM chunks)", {}),
    ("SELECT * FROM t_sales JOIN embedding_cache ON 1 = 1", {}),
    ("WITH d AS (SELECT * FROM documents) SELECT * FROM d", {}),
    ("WITH documents AS (SELECT 1 AS x) SELECT * FROM documents", {}),
    ("WITH t_sales AS (SELECT content FROM chunks) SELECT * FROM t_sales", {}),
    ("SELECT region FROM t_sales UNION SELECT content FROM chunks", {}),
    ("SELECT region, 1, 1 FROM t_sales UNION ALL SELECT name, sql, 1 FROM sqlite_master", {}),
    ("SELECT * FROM t_sales ORDER BY (SELECT 1 FROM calls)", {}),
    ("SELECT char(65) || (SELECT title FROM documents LIMIT 1)", {}),
    ("SELECT * FROM t_sales LIMIT (SELECT count(*) FROM documents)", {}),
    # Registered tables outside the scope or outside allowed_tables
    ("SELECT * FROM t_vault", {}),
    ("SELECT * FROM documents_vault", {}),
    ("SELECT * FROM documents_docs", {"allowed_tables": ["sales"]}),
    # Table-valued functions
    ("SELECT * FROM pragma_table_info('documents')", {}),
    ("SELECT * FROM json_each((SELECT group_concat(content) FROM chunks))", {}),
    ("SELECT * FROM generate_series(1, 1000000000)", {}),
    # Functions that touch files, load code or exist to build huge values
    ("SELECT load_extension('/tmp/evil.so')", {}),
    ("SELECT readfile('/etc/passwd')", {}),
    ("SELECT writefile('/tmp/iris-rag-evil.txt', 'x')", {}),
    ("SELECT * FROM t_sales WHERE 1 = 1 OR writefile('/tmp/iris-rag-evil.txt', region) > 0", {}),
    ("SELECT edit('x', 'vi')", {}),
    ("SELECT fts3_tokenizer('simple')", {}),
    ("SELECT randomblob(1000000000)", {}),
    ("SELECT hex(randomblob(100000000))", {}),
    ("SELECT zeroblob(1000000000)", {}),
    ("SELECT sqlite_version()", {}),
    # Bombs: values, patterns, recursion, joins, nesting
    ("SELECT length(printf('%.999999c', 'x') || printf('%.999999c', 'y'))", {}),
    ("SELECT replace(printf('%.5000c', 'x'), 'x', printf('%.5000c', 'y'))", {}),
    (f"SELECT * FROM t_sales WHERE region LIKE '{LONG_LIKE}'", {}),
    (f"SELECT * FROM t_sales WHERE region GLOB '{LONG_LIKE.replace('%', '*')}'", {}),
    ("SELECT * FROM t_sales WHERE region LIKE printf('%.2000c', '%')", {}),
    ("SELECT * FROM t_sales WHERE region REGEXP '(a+)+$'", {}),
    ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", {}),
    (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        {**COMPLEX, "timeout_ms": 200},
    ),
    ("SELECT count(*) FROM t_sales a, t_sales b, t_sales c, t_sales d, t_sales e", {}),
    ("SELECT * FROM (SELECT * FROM (SELECT * FROM (SELECT * FROM t_sales)))", {}),
    (
        "SELECT a.region FROM t_sales a JOIN t_sales b ON a.region = b.region",
        {"max_sql_complexity": "simple"},
    ),
    ("SELECT region, row_number() OVER (ORDER BY amount) FROM t_sales", {"max_sql_complexity": "simple"}),
    # Malformed, empty, parameters, unknown columns
    (";", {}),
    ("-- only a comment", {}),
    ("SELECT * FROM t_sales WHERE region = ?", {}),
    ("SELECT * FROM t_sales WHERE region = :region", {}),
    ("SELECT metadata FROM documents_docs", {}),
    ("SELECT * FROM t_sales INDEXED BY sqlite_autoindex_documents_1", {}),
    ("SELEC * FROM t_sales", {}),
]
# Each runs, and returns only bounded rows of allowed tables.
CONTAINED: list[tuple[str, dict[str, Any], int]] = [
    ("SELECT 1 /* ; DROP TABLE t_sales */", {}, 1),
    ("SELECT * FROM t_sales WHERE region = 'north' -- ' ; DROP TABLE t_sales", {}, 2),
    ("SELECT * FROM t_sales;", {}, 3),
    ("SELECT * FROM t_sales AS documents", {}, 3),
    ("SELECT id, title FROM documents_docs", {}, 3),
    (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
        {**COMPLEX, "max_rows": 50},
        50,
    ),
    ("SELECT a.region FROM t_sales a, t_sales b, t_sales c, t_sales d", {"max_rows": 10}, 10),
    ("SELECT * FROM t_sales WHERE region LIKE '%" + "a" * 900 + "%'", {}, 0),
    ("SELECT length(printf('%.999999c', 'x'))", {}, 1),
    ("SELECT count(*) FROM documents_docs", {}, 1),
]


def test_hostile_statements_are_rejected_or_contained_and_the_file_is_unchanged(guarded: RagService) -> None:
    assert len(HOSTILE) >= 50
    for path in EVIL_FILES:
        path.unlink(missing_ok=True)
    before = file_digest(guarded)

    reasons: list[str] = []
    for sql, params in HOSTILE:
        with pytest.raises(SqlRejectedError) as caught:
            run_sql(guarded, sql, **params)
        details = caught.value.details
        assert details["stage"] in ("parse", "check", "execution"), sql
        assert details["reason"] and "schema" in details, sql
        reasons.append(details["reason"])

    for sql, params, expected_rows in CONTAINED:
        specific = run_sql(guarded, sql, **params)["metadata"]["technique_specific"]
        assert specific["row_count"] == expected_rows, sql
        flat = repr(specific["rows"])
        assert not any(secret in flat for secret in SECRETS), sql

    assert file_digest(guarded) == before, "the database file changed"
    assert not any(path.exists() for path in EVIL_FILES)
    count = sqlite_file(guarded).execute("SELECT count(*) FROM t_sales").fetchone()[0]
    assert count == 3
    # A few reasons, to show they say what was wrong.
    said = dict(zip([(sql, repr(params)) for sql, params in HOSTILE], reasons, strict=True))
    assert "exactly one statement" in said["SELECT 1; DROP TABLE t_sales", "{}"]
    assert "internal to the store" in said["SELECT * FROM documents", "{}"]
    assert "not in allowed_tables" in said["SELECT * FROM t_vault", "{}"]
    assert "only SELECT is allowed; this is DELETE" in said["DELETE FROM t_sales", "{}"]
    assert "pattern" in said[f"SELECT * FROM t_sales WHERE region LIKE '{LONG_LIKE}'", "{}"]
    assert "grew past" in said["SELECT length(printf('%.999999c', 'x') || printf('%.999999c', 'y'))", "{}"]
    assert said["REINDEX", "{}"] == "only SELECT is allowed; this is REINDEX"
    recursive = [reason for (sql, _), reason in said.items() if sql.startswith("WITH RECURSIVE")]
    assert "a recursive CTE" in recursive[0] and "time limit" in recursive[1]


def test_complexity_is_counted_as_documented() -> None:
    sql = (
        "WITH recent AS (SELECT region FROM t_a WHERE day > '2024-01-01') "
        "SELECT a.region, (SELECT max(x) FROM t_b) FROM t_a a JOIN t_b b ON a.region = b.region "
        "WHERE a.region IN (SELECT region FROM recent) AND EXISTS (SELECT 1 FROM t_b) "
        "UNION SELECT region, 1 FROM t_b"
    )
    checked = check_sql(
        sql,
        dialect="sqlite",
        allowed=["t_a", "t_b"],
        registered=[],
        existing=[],
        complexity="complex",
        max_rows=10,
    )
    assert checked.complexity == {
        "joins": 1,
        "subqueries": 3,
        "ctes": 1,
        "set_operations": 1,
        "window_functions": 0,
        "recursive": False,
    }
    assert checked.tables == ("t_a", "t_b")
    with pytest.raises(SqlRejectedError, match="3 subqueries"):
        check_sql(
            sql,
            dialect="sqlite",
            allowed=["t_a", "t_b"],
            registered=[],
            existing=[],
            complexity="moderate",
            max_rows=10,
        )


@pytest.mark.parametrize(
    ("dialect", "sql", "named"),
    [
        ("sqlite", "SELECT sqlite_version()", "sqlite_version()"),
        ("postgres", "SELECT version()", "version()"),
        ("sqlite", "SELECT Load_Extension('x')", "load_extension()"),
    ],
)
def test_a_refused_function_is_named_as_the_caller_wrote_it(dialect: str, sql: str, named: str) -> None:
    """sqlglot reads sqlite_version() and version() as CURRENT_VERSION: the refusal names what was written."""
    with pytest.raises(SqlRejectedError) as caught:
        check_sql(
            sql, dialect=dialect, allowed=[], registered=[], existing=[], complexity="simple", max_rows=5
        )
    assert f"function {named} " in caught.value.message and "current_version" not in caught.value.message


@pytest.mark.parametrize(
    ("sql", "max_rows", "query_limit", "row_limit", "executed_limit"),
    [
        ("SELECT x FROM t_a", 100, None, 100, "LIMIT 101"),
        ("SELECT x FROM t_a LIMIT 5", 100, 5, 5, "LIMIT 5"),
        ("SELECT x FROM t_a LIMIT 500", 100, 500, 100, "LIMIT 101"),
        ("SELECT x FROM t_a LIMIT -1", 10, None, 10, "LIMIT 11"),
        ("SELECT x FROM t_a LIMIT 3 OFFSET 2", 100, 3, 3, "LIMIT 3 OFFSET 2"),
        ("SELECT x FROM t_a UNION SELECT x FROM t_a LIMIT 7", 5, 7, 5, "LIMIT 6"),
    ],
)
def test_the_row_limit_is_the_smaller_one(
    sql: str, max_rows: int, query_limit: int | None, row_limit: int, executed_limit: str
) -> None:
    checked = check_sql(
        sql,
        dialect="sqlite",
        allowed=["t_a"],
        registered=[],
        existing=[],
        complexity="moderate",
        max_rows=max_rows,
    )
    assert (checked.query_limit, checked.row_limit) == (query_limit, row_limit)
    assert checked.executed_sql.endswith(executed_limit)


def _unchecked(sql: str) -> CheckedSql:
    """A statement as if the static check had let it through (to test the run-time layer alone)."""
    return CheckedSql(sql, sql, (), (), {}, None, 10, 11)


def test_the_runtime_layer_stops_what_the_check_would_have_caught(guarded: RagService) -> None:
    database = guarded.settings.database_path
    before = file_digest(guarded)

    def run(sql: str) -> str:
        with pytest.raises(SqlRejectedError) as caught:
            execute_readonly(
                database,
                _unchecked(sql),
                select_limits(["t_sales"], [], allow_recursive=False, timeout_ms=500),
                safety.SqlGate(),
            )
        return str(caught.value.details["reason"])

    assert "reading table 'documents'" in run("SELECT content FROM documents")
    assert "reading table 'documents'" in run("SELECT id FROM documents_docs")  # the view is not allowed here
    assert "load_extension" in run("SELECT load_extension('x')")
    assert "readfile" in run("SELECT readfile('/etc/passwd')")
    assert "RECURSIVE" in run("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x FROM c) SELECT x FROM c")
    assert "DELETE" in run("DELETE FROM t_sales")
    assert "PRAGMA" in run("PRAGMA query_only = OFF")
    assert "ATTACH" in run("ATTACH DATABASE '/tmp/iris-rag-evil.db' AS evil")
    assert "one statement at a time" in run("SELECT 1; DELETE FROM t_sales")
    # Without any authorizer the connection still cannot write.
    connection = readonly_connection(database, select_limits([], [], allow_recursive=False, timeout_ms=500))
    with pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only"):
        connection.execute("CREATE TABLE evil (x)")
    connection.close()
    allowed = execute_readonly(
        database,
        _unchecked("SELECT id FROM documents_docs ORDER BY id"),
        select_limits(["documents_docs"], ["documents_docs"], allow_recursive=False, timeout_ms=500),
        safety.SqlGate(),
    )
    assert allowed.rows == [["aspirin"], ["sourdough"], ["volcano"]]
    assert file_digest(guarded) == before
    assert not Path("/tmp/iris-rag-evil.db").exists()


def test_the_time_limit_stops_a_runaway_statement(guarded: RagService) -> None:
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    started = time.perf_counter()
    with pytest.raises(SqlRejectedError, match="150 ms time limit"):
        run_sql(guarded, forever, max_sql_complexity="complex", timeout_ms=150)
    short = time.perf_counter() - started
    started = time.perf_counter()
    with pytest.raises(SqlRejectedError, match="700 ms time limit"):
        run_sql(guarded, forever, max_sql_complexity="complex", timeout_ms=700)
    long = time.perf_counter() - started
    assert 0.15 <= short < long and long >= 0.7


MEGABYTE_A = "printf('%.999000c', 'a')"
# Issue 11, defect 8: statements that spend their time inside one built-in function call (no VM steps,
# so the progress handler never runs) or that build huge values; each must be refused within its limit.
PAST_THE_TIME_LIMIT: list[tuple[str, str]] = [
    ("SELECT printf('%.*c', 900000000, 'x')", "'*' widths"),  # the reproduction
    ("SELECT format('%*d', 900000000, 1)", "'*' widths"),
    ("SELECT printf('%.900000000c', 'x')", "width or precision past"),
    ("SELECT printf(printf('%s', '%.900000000c'), 'x')", "literal format"),
    ("SELECT length(printf(region, 1)) FROM t_sales", "literal format"),
    (f"SELECT instr({MEGABYTE_A}, printf('%.400000c', 'a') || 'b')", "time limit"),
    (f"SELECT length(replace({MEGABYTE_A}, printf('%.400000c', 'a') || 'b', 'c'))", "time limit"),
    ("SELECT zeroblob(1000000000)", "not allowed"),
    ("SELECT length(randomblob(1000000000))", "not allowed"),
    (f"SELECT length(replace({MEGABYTE_A}, 'a', 'bb'))", "grew past"),
    (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000) "
        "SELECT length(group_concat(printf('%.100c', 'x'))) FROM c a, c b",
        "grew past|time limit",
    ),
    (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000) "
        "SELECT count(*) FROM c a, c b, c d",
        "time limit",
    ),
    ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c", "time limit"),
]


@pytest.mark.parametrize(("sql", "reason"), PAST_THE_TIME_LIMIT)
def test_no_statement_runs_past_its_time_limit(guarded: RagService, sql: str, reason: str) -> None:
    started = time.perf_counter()
    with pytest.raises(SqlRejectedError) as caught:
        run_sql(guarded, sql, max_sql_complexity="complex", timeout_ms=300)
    elapsed = time.perf_counter() - started
    assert re.search(reason, caught.value.details["reason"]), caught.value.details["reason"]
    assert elapsed < 3.0, f"{sql} was answered after {elapsed:.1f} s against a 0.3 s limit"


def test_the_gate_caps_running_statements_and_refuses_a_call_that_waits_too_long(
    guarded: RagService,
) -> None:
    database = guarded.settings.database_path
    gate = safety.SqlGate(1)
    # Stuck in one C call for seconds: its caller is answered at the limit, its slot stays taken.
    runaway = _unchecked(f"SELECT instr({MEGABYTE_A}, printf('%.400000c', 'a') || 'b')")
    with pytest.raises(SqlRejectedError, match="time limit"):
        execute_readonly(
            database, runaway, select_limits([], [], allow_recursive=False, timeout_ms=100), gate
        )
    started = time.perf_counter()
    with pytest.raises(SqlRejectedError, match="1 SQL statements are already running"):
        execute_readonly(
            database,
            _unchecked("SELECT 1"),
            select_limits([], [], allow_recursive=False, timeout_ms=200),
            gate,
        )
    assert time.perf_counter() - started < 3.0
    # Once the runaway really ends, its slot is free again.
    deadline = time.monotonic() + 60
    while True:
        try:
            result = execute_readonly(
                database,
                _unchecked("SELECT 1"),
                select_limits([], [], allow_recursive=False, timeout_ms=200),
                gate,
            )
            break
        except SqlRejectedError:
            assert time.monotonic() < deadline, "the runaway statement never gave its slot back"
    assert result.rows == [[1]]


def test_a_cancelled_request_stops_waiting_for_its_statement(guarded: RagService) -> None:
    token = CancelToken()
    token.cancel("test")
    with cancellation_scope(token), pytest.raises(RequestCancelledError):
        run_sql(guarded, "SELECT count(*) FROM t_sales")


# PostgreSQL's own ways out: server functions, catalogs, other schemas, writes hidden in a query.
POSTGRES_HOSTILE = [
    "SELECT pg_sleep(10)",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT * FROM pg_read_file('/etc/passwd')",
    "SELECT pg_ls_dir('.')",
    "SELECT lo_import('/etc/passwd')",
    "SELECT set_config('statement_timeout', '0', false)",
    "SELECT current_setting('data_directory')",
    "SELECT version()",
    "SELECT current_user",
    "SELECT user",
    "SELECT current_database()",
    "SELECT * FROM pg_catalog.pg_authid",
    "SELECT * FROM pg_class",
    "SELECT * FROM pg_stat_activity",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM public.documents",
    "SELECT * FROM sqlrag.t_vault",
    "SELECT * FROM t_vault",
    "TABLE documents",
    "SELECT row_to_json(d) FROM documents d",
    "SELECT (SELECT string_agg(content, ',') FROM public.chunks)",
    "SELECT * FROM t_sales, LATERAL (SELECT * FROM documents) d",
    "COPY t_sales TO '/tmp/iris-rag-evil.txt'",
    "SELECT dblink('host=x', 'select 1')",
    "SELECT pg_terminate_backend(1)",
    "SELECT pg_advisory_lock(1)",
    "SELECT nextval('documents_row_id_seq')",
    "SELECT query_to_xml('select * from documents', true, true, '')",
    "WITH x AS (DELETE FROM t_sales RETURNING *) SELECT * FROM x",
    "SELECT * FROM t_sales FOR UPDATE",
    "SELECT 1; SELECT pg_sleep(5)",
    "SET ROLE postgres",
    "DO $$ BEGIN PERFORM 1; END $$",
    "LOCK t_sales",
    "PREPARE p AS SELECT 1",
    "SELECT * FROM t_sales WHERE region = $1",
    "SELECT * FROM t_sales OFFSET -1",
    # Known to sqlglot as ordinary functions or types, so refused by the postgres dialect's own checks.
    "SELECT repeat('x', 900000000)",
    "SELECT lpad(region, 900000000) FROM t_sales",
    "SELECT generate_series(1, 1000000000)",
    "SELECT regexp_replace(region, 'n', 'x') FROM t_sales",
    "SELECT pg_catalog.lower(region) FROM t_sales",
    "SELECT 10::regrole",
    "SELECT tableoid::regclass FROM t_sales",
    "SELECT * FROM t_sales FOR SHARE",
    "SELECT * FROM main.t_sales",
    "SELECT lo_export(1, '/tmp/iris-rag-evil.txt')",
    "SELECT dblink_exec('host=x', 'DROP TABLE t_sales')",
]
# Postgres functions within bounds still run: (statement, rows).
POSTGRES_CONTAINED = [
    ("SELECT repeat('ab', 3)", 1),
    ("SELECT lpad(region, 8, '*') FROM t_sales", 3),
    ("SELECT date_trunc('month', CAST(sold_on AS DATE)) AS m, sum(amount) FROM t_sales GROUP BY 1", 3),
]


@pytest.fixture
def guarded_postgres(postgres_url: str, tmp_path: Path, embedder: Any) -> Any:
    """The `guarded` collections and tables on RAG_STORE=postgres."""
    from iris_rag.settings import Settings

    settings = Settings(
        RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, RAG_DATA_DIR=tmp_path, RAG_TECHNIQUES="sqlrag"
    )
    service = RagService(settings, embedder=embedder)
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        vault = {"id": "v", "content": "VAULT-SECRET: the launch code is 0000.", "metadata": {"level": 9}}
        service.ingest({"collection_id": "vault", "documents": [vault]})
        pipeline = service.pipelines["sqlrag"]
        assert isinstance(pipeline, SqlRagPipeline)
        pipeline.ingest_table({"table": "sales", "collection_id": "docs", "rows": SALES})
        pipeline.ingest_table(
            {"table": "vault", "collection_id": "vault", "rows": [{"code": "VAULT-SECRET"}]}
        )
        yield service
    finally:
        service.close()


def test_postgres_refuses_what_sqlite_refuses_and_its_own_ways_out(guarded_postgres: RagService) -> None:
    """Every hostile statement is SQL_REJECTED on Postgres too; contained ones return only allowed rows."""
    import psycopg

    url = guarded_postgres.settings.postgres_url
    assert url is not None

    def snapshot() -> tuple[Any, ...]:
        with psycopg.connect(url.get_secret_value()) as connection:
            return tuple(
                connection.execute(query).fetchone()
                for query in (
                    "SELECT count(*), string_agg(region || amount, ',' ORDER BY region, amount) "
                    "FROM sqlrag.t_sales",
                    "SELECT count(*) FROM documents",
                    "SELECT count(*) FROM structured_tables",
                )
            )

    before = snapshot()
    EVIL_FILES[1].unlink(missing_ok=True)
    reasons = {}
    for sql in [s for s, params in HOSTILE if not params] + POSTGRES_HOSTILE:
        with pytest.raises(SqlRejectedError) as caught:
            run_sql(guarded_postgres, sql)
        reasons[sql] = caught.value.details["reason"]
    for sql, params, expected_rows in CONTAINED:
        if "printf" in sql:  # SQLite's function; Postgres has none of that name (refused, see below)
            continue
        specific = run_sql(guarded_postgres, sql, **params)["metadata"]["technique_specific"]
        assert specific["row_count"] == expected_rows, sql
        assert not any(secret in repr(specific["rows"]) for secret in SECRETS), sql
    for sql, expected in POSTGRES_CONTAINED:
        assert run_sql(guarded_postgres, sql)["metadata"]["technique_specific"]["row_count"] == expected, sql
    limited = run_sql(guarded_postgres, "SELECT region FROM t_sales LIMIT -1")["metadata"][
        "technique_specific"
    ]
    assert limited["row_count"] == 3, "a negative LIMIT is replaced by the row limit, as on SQLite"
    assert snapshot() == before, "nothing was written"
    assert not EVIL_FILES[1].exists()
    assert "internal to the store" in reasons["SELECT * FROM pg_class"]
    assert "tells about the server" in reasons["SELECT version()"]
    assert "only the store's own tables" in reasons["SELECT * FROM public.documents"]
    assert (
        "time limit"
        in reasons["WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"]
        or "recursive CTE"
        in reasons["WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"]
    )


def test_postgres_runtime_layer_and_time_limit(guarded_postgres: RagService) -> None:
    """What the static check would catch is refused again by the plan check; a runaway stops at its limit."""
    pipeline = guarded_postgres.pipelines["sqlrag"]
    assert isinstance(pipeline, SqlRagPipeline)
    storage = pipeline._storage
    limits = select_limits(["t_sales"], [], allow_recursive=True, timeout_ms=300)
    for unchecked in ("SELECT code FROM t_vault", "SELECT * FROM public.chunks", "SELECT * FROM pg_class"):
        with pytest.raises(SqlRejectedError, match="not authorized") as caught:
            storage.run_select(
                CheckedSql(unchecked, unchecked, (), (), {}, None, 10, 11), limits, safety.SqlGate()
            )
        assert caught.value.details["stage"] == "execution"
    write = "SELECT * FROM t_sales FOR UPDATE"
    with pytest.raises(SqlRejectedError, match=r"read-only|PostgreSQL error"):
        storage.run_select(CheckedSql(write, write, (), (), {}, None, 10, 11), limits, safety.SqlGate())
    loop = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    started = time.monotonic()
    with pytest.raises(SqlRejectedError, match="300 ms time limit"):
        storage.run_select(CheckedSql(loop, loop, (), ("c",), {}, None, 10, 11), limits, safety.SqlGate())
    assert time.monotonic() - started < 5


def test_deep_nesting_is_refused_not_a_crash() -> None:
    """1,200 nested calls made the parser recurse past Python's limit: RecursionError, an internal error."""
    sql = "SELECT " + "abs(" * 1200 + "1" + ")" * 1200
    for dialect in ("sqlite", "postgres"):
        with pytest.raises(SqlRejectedError, match="nested too deeply"):
            check_sql(
                sql,
                dialect=dialect,
                allowed=[],
                registered=[],
                existing=[],
                complexity="complex",
                max_rows=10,
            )
