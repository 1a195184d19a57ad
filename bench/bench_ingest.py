"""Ingest throughput (chunks/s) beside the raw encoder's throughput on the very same chunk texts.

    .venv/bin/python -m bench.bench_ingest [--corpus FILE.jsonl] [--limit N] [--repeats R] [--techniques T]
        [--index-build background,inline]

The ratio ingest/raw says what chunking, bookkeeping and SQLite writes cost on top of the encoder.
`--techniques` (as RAG_TECHNIQUES: names or all) also builds those techniques' ingest-time indexes (ColBERT
token vectors, NodeRAG leaf vectors, the GraphRAG graph), which is what a default server does on ingest;
without it only the chunks, vectors and keyword index are built (what rag_basic and rag_hybrid_ifind need).
`--index-build` (INDEX_BUILD, one mode or several, each timed in every repeat): with background (the
default) the ingest returns after the core and the indexes are built afterwards; the run then also times
until every index is ready (ready_chunks_per_s: the total work, which background building does not shrink).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SAMPLE, local_embedder, machine, median, read_jsonl, write
from iris_rag.embedder import Embedder
from iris_rag.ingestion.chunking import chunk_text
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.technique_index import ChunkEncodingSource
from iris_rag.text import embedding_text

BATCH = 256  # documents per ingest call, as `iris-rag ingest` does


def main() -> None:
    """Alternate raw-encoder and full-ingest runs and report medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=SAMPLE / "corpus.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="only the first N documents")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--techniques", default="basic", help="served techniques (RAG_TECHNIQUES), or all")
    parser.add_argument("--index-build", default=None, help="INDEX_BUILD modes to time, comma-separated")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    modes = args.index_build.split(",") if args.index_build else [Settings().index_build]

    records = read_jsonl(args.corpus, args.limit)
    documents = [SourceDocument(r["_id"], r["text"], r.get("title", ""), {}) for r in records]
    settings = Settings()
    embedder = local_embedder(settings)
    embedder.load()
    texts = [
        embedding_text(d.title, span.text)
        for d in documents
        for span in chunk_text(d.content, size=settings.chunk_size, overlap=settings.chunk_overlap)
    ]
    embedder.encode(texts[:64])  # warm-up

    raw_rates: list[float] = []
    ingest_rates: dict[str, list[float]] = {mode: [] for mode in modes}
    ready_rates: dict[str, list[float]] = {mode: [] for mode in modes}
    stages: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
    indexes: list[str] = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        embedder.encode(texts)
        raw_rates.append(len(texts) / (time.perf_counter() - started))
        for mode in modes:
            chunks, ingested_s, ready_s, indexes = _ingest_run(
                args.techniques, mode, documents, embedder, stages[mode]
            )
            assert chunks == len(texts)
            ingest_rates[mode].append(chunks / ingested_s)
            ready_rates[mode].append(chunks / ready_s)

    raw = median(raw_rates)
    by_mode = {
        mode: {
            "ingest_chunks_per_s": median(ingest_rates[mode]),
            "ratio_ingest_to_raw": round(median(ingest_rates[mode]) / raw, 3),
            "ready_chunks_per_s": median(ready_rates[mode]),
            "ratio_ready_to_raw": round(median(ready_rates[mode]) / raw, 3),
            "runs": {
                "ingest": [round(r, 1) for r in ingest_rates[mode]],
                "ready": [round(r, 1) for r in ready_rates[mode]],
            },
            # Seconds per ingest run in each timed stage (summed over its batches), median over the runs.
            "stage_seconds": {name: round(median(times), 2) for name, times in stages[mode].items()},
        }
        for mode in modes
    }
    first = by_mode[modes[0]]
    write(
        args.out,
        {
            "benchmark": "ingest",
            "corpus": str(args.corpus),
            "documents": len(documents),
            "chunks": len(texts),
            "repeats": args.repeats,
            "techniques": args.techniques,
            "technique_indexes": indexes,
            "embedding_backend": embedder.backend,
            "raw_encoder_chunks_per_s": raw,
            "index_build": modes[0],
            "ingest_chunks_per_s": first["ingest_chunks_per_s"],
            "ratio_ingest_to_raw": first["ratio_ingest_to_raw"],
            "runs": {"raw": [round(r, 1) for r in raw_rates]},
            "modes": by_mode,
            "machine": machine(),
        },
    )


def _ingest_run(
    techniques: str,
    mode: str,
    documents: list[SourceDocument],
    embedder: Embedder,
    stages: dict[str, list[float]],
) -> tuple[int, float, float, list[str]]:
    """One ingest into a fresh store: its chunks, seconds until it returned, until every index was ready."""
    with tempfile.TemporaryDirectory() as folder:
        run_settings = Settings(RAG_DATA_DIR=Path(folder), RAG_TECHNIQUES=techniques, INDEX_BUILD=mode)
        service = RagService(run_settings, embedder=embedder)
        ingestor: Ingestor = service.ingestor
        _time_stages(ingestor, stages)
        started = time.perf_counter()
        chunks = sum(
            ingestor.ingest("bench", documents[i : i + BATCH]).chunks_created
            for i in range(0, len(documents), BATCH)
        )
        ingested_s = time.perf_counter() - started
        service.wait_for_indexes("bench", quiet=True)
        ready_s = time.perf_counter() - started
        indexes = [index.name for index in ingestor.technique_indexes]
        service.close()
    return chunks, ingested_s, ready_s, indexes


def _time_stages(ingestor: Ingestor, stages: dict[str, list[float]]) -> None:
    """Wrap the shared chunk pass and every index's prepare() to add up their seconds in this run."""

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                stages[name][-1] += time.perf_counter() - started  # this run's slot, the last

        return wrapper

    for index in ingestor.technique_indexes:
        stages.setdefault(f"prepare {index.name}", []).append(0.0)
        index.prepare = timed(f"prepare {index.name}", index.prepare)  # type: ignore[method-assign]
        if isinstance(index, ChunkEncodingSource):
            stages.setdefault("shared chunk pass", []).append(0.0)
            index.encode_chunks = timed("shared chunk pass", index.encode_chunks)  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
