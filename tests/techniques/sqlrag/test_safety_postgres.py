"""The guard in the postgres dialect: what Postgres offers and SQLite lacks is refused before anything runs.

No database here: check_sql alone (test_safety.py runs the same statements against a real server).
"""

import time

import pytest

from iris_rag.errors import SqlRejectedError
from iris_rag.techniques.sqlrag.safety import check_sql
from iris_rag.techniques.sqlrag.storage import CheckedSql


def check(sql: str, dialect: str = "postgres") -> CheckedSql:
    return check_sql(
        sql,
        dialect=dialect,
        allowed=["t_sales"],
        registered=["t_sales", "t_vault"],
        existing=["documents", "chunks", "structured_tables", "t_sales", "t_vault"],
        complexity="complex",
        max_rows=10,
    )


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        # Server functions, by name and by a schema-qualified name.
        ("SELECT pg_sleep(10)", "pg_sleep() is not available"),
        ("SELECT pg_catalog.pg_sleep(10)", "without a schema"),
        ("SELECT pg_catalog.lower(region) FROM t_sales", "without a schema"),
        ("SELECT public.lower(region) FROM t_sales", "without a schema"),
        ("SELECT pg_read_file('/etc/passwd')", "pg_read_file() is not available"),
        ("SELECT pg_read_binary_file('/etc/passwd')", "is not available"),
        ("SELECT lo_import('/etc/passwd')", "lo_import() is not available"),
        ("SELECT lo_export(1, '/tmp/x')", "lo_export() is not available"),
        ("SELECT lo_get(1)", "lo_get() is not available"),
        ("SELECT dblink('host=x', 'select 1')", "dblink() is not available"),
        ("SELECT dblink_exec('host=x', 'drop table t')", "dblink_exec() is not available"),
        ("SELECT set_config('statement_timeout', '0', true)", "tells about the server"),
        ("SELECT current_setting('data_directory')", "tells about the server"),
        ("SELECT version()", "tells about the server"),
        ("SELECT current_user", "tells about the server"),
        ("SELECT setval('documents_row_id_seq', 1)", "setval() is not available"),
        ("SELECT pg_notify('c', 'x')", "pg_notify() is not available"),
        # Catalogs and other schemas.
        ("SELECT * FROM pg_class", "internal to the store"),
        ("SELECT * FROM pg_catalog.pg_authid", "only the store's own tables"),
        ("SELECT * FROM information_schema.tables", "only the store's own tables"),
        ("SELECT * FROM public.documents", "only the store's own tables"),
        ("SELECT * FROM main.t_sales", "only the store's own tables"),
        ("SELECT 'pg_authid'::regclass", "catalogs"),
        ("SELECT 10::regrole", "catalogs"),
        ("SELECT tableoid::regclass FROM t_sales", "catalogs"),
        ("SELECT CAST(1 AS pg_catalog.regproc)", "catalogs"),
        # Values and series of any size: Postgres has no value limit to stop them.
        ("SELECT repeat('x', 900000000)", "at most 1000000 bytes"),
        ("SELECT repeat(repeat('x', 1000), 1000)", "at most 1000000 bytes"),
        ("SELECT repeat(region, 3) FROM t_sales", "at most 1000000 bytes"),
        ("SELECT lpad('x', 900000000)", "at most 1000000 bytes"),
        ("SELECT rpad(region, amount, 'y') FROM t_sales", "at most 1000000 bytes"),
        ("SELECT generate_series(1, 1000000000)", "builds a series"),
        ("SELECT count(*) FROM (SELECT generate_series(1, 1000000000) AS n FROM t_sales) AS s", "series"),
        ("SELECT * FROM generate_series(1, 10)", "table-valued functions"),
        ("SELECT array_fill(1, ARRAY[100000000])", "is not available"),
        # Regular expressions, refused as REGEXP is on SQLite.
        ("SELECT region FROM t_sales WHERE region ~ 'n.*'", "REGEXP is not available"),
        ("SELECT regexp_replace(region, 'n', 'x') FROM t_sales", "REGEXP is not available"),
        ("SELECT region FROM t_sales WHERE region SIMILAR TO 'n%'", "SIMILAR TO"),
        # Writes, locks and more than one statement.
        ("SELECT * FROM t_sales FOR UPDATE", "locks rows"),
        ("SELECT * FROM t_sales FOR SHARE", "locks rows"),
        ("SELECT * INTO TEMP copied FROM t_sales", "INTO writes a table"),
        ("WITH x AS (DELETE FROM t_sales RETURNING *) SELECT * FROM x", "not allowed inside a query"),
        ("SELECT 1; SELECT pg_sleep(5)", "exactly one statement"),
        ("COPY t_sales TO '/tmp/iris-rag-evil.txt'", "only SELECT"),
        ("SET statement_timeout = 0", "only SELECT"),
        ("SELECT * FROM t_sales OFFSET -1", "OFFSET must not be negative"),
        ("SELECT * FROM t_sales LIMIT ALL", "LIMIT must be a whole number"),
    ],
)
def test_postgres_dangers_are_refused_by_the_check(sql: str, reason: str) -> None:
    with pytest.raises(SqlRejectedError) as caught:
        check(sql)
    assert reason in caught.value.details["reason"], caught.value.details["reason"]
    assert caught.value.details["stage"] in ("parse", "check")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT repeat('ab', 3)",
        "SELECT lpad(region, 8, '*') FROM t_sales",
        "SELECT rpad(region, 8) FROM t_sales",
        "SELECT EXTRACT(YEAR FROM CAST(sold_on AS DATE)) AS y, sum(amount) FROM t_sales GROUP BY 1",
        "SELECT date_trunc('month', CAST(sold_on AS DATE)) FROM t_sales",
        "SELECT region, amount::integer FROM t_sales WHERE region LIKE 'n%'",
        "SELECT 1::oid",
    ],
)
def test_ordinary_postgres_queries_pass(sql: str) -> None:
    assert check(sql).executed_sql.endswith("LIMIT 11")


def test_a_negative_limit_means_the_row_limit_as_on_sqlite() -> None:
    """Postgres would fail on LIMIT -1; the checked statement carries the row limit instead."""
    for dialect in ("sqlite", "postgres"):
        checked = check("SELECT region FROM t_sales LIMIT -1", dialect)
        assert checked.query_limit is None and checked.executed_sql.endswith("LIMIT 11")


def test_sqlite_keeps_its_own_schema_name() -> None:
    """`main` is SQLite's name for the store's own file; only Postgres refuses it as another schema."""
    assert check("SELECT * FROM main.t_sales", "sqlite").tables == ("t_sales",)


def test_the_postgres_check_stays_linear_in_the_statement() -> None:
    """Function names come from the parsed nodes: a long chain of ANDs checks as fast as on SQLite."""
    chain = "SELECT region FROM t_sales WHERE " + " AND ".join(["amount=1"] * 740)
    started = time.monotonic()
    check(chain)
    assert time.monotonic() - started < 2
