"""One large document ingested with every technique served: time, CPU and peak memory by document size.

    .venv/bin/python -m bench.bench_large_document [--kb 100] [--corpus FILE.jsonl] [--techniques all]
        [--index-build background|inline] [--out FILE]

The document is the corpus's abstracts joined by newlines (real sentences), cut to the size. Run one size
and one mode per process: the peak resident memory (ru_maxrss) is the process's, and the figure reported is
its growth during the whole work, above what the loaded model already holds. The clock runs until every
technique index is built: under INDEX_BUILD=background (the default) the ingest returns after the core and
the indexes are built afterwards, so the result gives both (returned_*: what a client waits for; wall_s,
cpu_s: the whole work). The encoder is the one the settings name (EMBEDDING_BACKEND, EMBEDDING_DEVICE).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from bench.common import SCIFACT, local_embedder, machine, read_jsonl, write
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings


def main() -> None:
    """Ingest one generated document and report what it cost."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kb", type=int, default=100, help="document size in thousands of characters")
    parser.add_argument("--corpus", type=Path, default=SCIFACT / "corpus.jsonl")
    parser.add_argument("--techniques", default="all", help="served techniques (RAG_TECHNIQUES)")
    parser.add_argument(
        "--index-build", choices=["background", "inline"], default=None, help="INDEX_BUILD (default: as set)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args()

    size = args.kb * 1000
    parts: list[str] = []
    for record in read_jsonl(args.corpus):
        parts.append(record["text"])
        if sum(map(len, parts)) + len(parts) >= size:
            break
    content = "\n".join(parts)[:size]

    settings = Settings()
    mode = args.index_build or settings.index_build
    embedder = local_embedder(settings)
    embedder.load()
    embedder.encode(["warm-up " * 100] * 8)
    with tempfile.TemporaryDirectory() as folder:
        run_settings = Settings(RAG_DATA_DIR=Path(folder), RAG_TECHNIQUES=args.techniques, INDEX_BUILD=mode)
        service = RagService(run_settings, embedder=embedder, index_scan=[])
        try:
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            started, cpu = time.perf_counter(), time.process_time()
            document = SourceDocument("large", content, "Large document", {})
            result = service.ingestor.ingest("large", [document])
            returned_wall_s, returned_cpu_s = time.perf_counter() - started, time.process_time() - cpu
            service.wait_for_indexes("large", quiet=True)
            wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
            rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            indexes = [index.name for index in service.ingestor.technique_indexes]
        finally:
            service.close()
    write(
        args.out,
        {
            "benchmark": "large_document",
            "characters": len(content),
            "techniques": args.techniques,
            "technique_indexes": indexes,
            "index_build": mode,
            "embedding_backend": embedder.backend,
            "chunks": result.chunks_created,
            # Until the ingest returned (under background: the core only), then until every index was ready.
            "returned_wall_s": round(returned_wall_s, 1),
            "returned_cpu_s": round(returned_cpu_s, 1),
            "wall_s": round(wall_s, 1),
            "cpu_s": round(cpu_s, 1),
            "rss_before_mb": rss_before // 1024,
            "rss_peak_growth_mb": (rss_peak - rss_before) // 1024,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
