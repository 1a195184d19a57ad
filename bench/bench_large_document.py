"""One large document ingested with every technique served: time, CPU and peak memory by document size.

    .venv/bin/python -m bench.bench_large_document [--kb 100] [--corpus FILE.jsonl] [--techniques all]

The document is the corpus's abstracts joined by newlines (real sentences), cut to the size. Run one size
per process: the peak resident memory (ru_maxrss) is the process's, and the figure reported is its growth
during the ingest, above what the loaded model already holds.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from bench.common import SCIFACT, machine, read_jsonl, write
from iris_rag.embedder import Embedder
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings


def main() -> None:
    """Ingest one generated document and report what it cost."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kb", type=int, default=100, help="document size in thousands of characters")
    parser.add_argument("--corpus", type=Path, default=SCIFACT / "corpus.jsonl")
    parser.add_argument("--techniques", default="all", help="served techniques (RAG_TECHNIQUES)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    size = args.kb * 1000
    parts: list[str] = []
    for record in read_jsonl(args.corpus):
        parts.append(record["text"])
        if sum(map(len, parts)) + len(parts) >= size:
            break
    content = "\n".join(parts)[:size]

    settings = Settings()
    embedder = Embedder(settings.embedding_model, batch_size=settings.embedding_batch_size)
    embedder.load()
    embedder.encode(["warm-up " * 100] * 8)
    with tempfile.TemporaryDirectory() as folder:
        service = RagService(
            Settings(RAG_DATA_DIR=Path(folder), RAG_TECHNIQUES=args.techniques), embedder=embedder
        )
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started, cpu = time.perf_counter(), time.process_time()
        result = service.ingestor.ingest("large", [SourceDocument("large", content, "Large document", {})])
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        service.close()
    write(
        args.out,
        {
            "benchmark": "large_document",
            "characters": len(content),
            "techniques": args.techniques,
            "chunks": result.chunks_created,
            "wall_s": round(wall_s, 1),
            "cpu_s": round(cpu_s, 1),
            "rss_before_mb": rss_before // 1024,
            "rss_peak_growth_mb": (rss_peak - rss_before) // 1024,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
