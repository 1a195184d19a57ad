"""rag_smart_questions and rag_generate_podcast on the bundled SciFact sample (300 abstracts), no LLM.

Questions: for the first N sample queries as contexts (count 5), how many questions pass the retrieval
check, how many candidates fail it, and the call's latency. Podcasts: for each requested length, the
measured duration (and its ratio to the request), the engine's measured words per minute, the wall time
of the call (median of --repeat runs; the script is the same each time) and the file size.

    .venv/bin/python -m bench.bench_new_tools [--contexts 20] [--minutes 1 5 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import SAMPLE, machine, median, percentiles, read_jsonl, write
from iris_rag.service import RagService
from iris_rag.settings import Settings

TOPICS = ["vitamin D and bone health", "gene expression in cancer", "immune cells and inflammation"]


def main() -> None:
    """Run both tools and print (and save) the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--contexts", type=int, default=20)
    parser.add_argument("--minutes", type=int, nargs="+", default=[1, 5, 30])
    parser.add_argument("--repeat", type=int, default=3, help="podcasts per length (wall time: the median)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        service = RagService(Settings(RAG_DATA_DIR=Path(data_dir), RAG_TECHNIQUES="basic,hybrid_ifind"))
        try:
            service.embedder.wait_ready()
            documents = [
                {"id": r["_id"], "title": r["title"], "content": r["text"]}
                for r in read_jsonl(SAMPLE / "corpus.jsonl")
            ]
            service.ingest({"collection_id": "sci", "documents": documents})
            result: dict[str, Any] = {"machine": machine(), "documents": len(documents)}
            result["questions"] = _questions(service, args.contexts)
            result["podcasts"] = [_podcast(service, minutes, args.repeat) for minutes in args.minutes]
        finally:
            service.close()
    write(args.out, result)


def _questions(service: RagService, contexts: int) -> dict[str, Any]:
    latencies: list[float] = []
    returned: list[float] = []
    rejected: list[float] = []
    examples: list[str] = []
    for query in read_jsonl(SAMPLE / "queries.jsonl", contexts):
        started = time.perf_counter()
        answer = service.smart_questions({"context": query["text"], "collection_id": "sci", "count": 5})
        latencies.append((time.perf_counter() - started) * 1000)
        returned.append(len(answer["questions"]))
        rejected.append(answer["candidates_rejected"])
        examples.extend(q["question"] for q in answer["questions"][:1])
    return {
        "contexts": contexts,
        "count": 5,
        "latency_ms": percentiles(latencies),
        "questions_returned_median": median(returned),
        "questions_returned_total": sum(returned),
        "candidates_rejected_total": sum(rejected),
        "examples": examples[:10],
    }


def _podcast(service: RagService, minutes: int, repeat: int) -> dict[str, Any]:
    topic = TOPICS[minutes % len(TOPICS)]
    walls: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        podcast = service.generate_podcast(
            {"topic": topic, "collection_id": "sci", "duration_minutes": minutes}
        )
        walls.append(time.perf_counter() - started)
        Path(podcast["audio_path"]).unlink()
    wall_s = median(walls)
    return {
        "topic": topic,
        "requested_s": podcast["requested_s"],
        "duration_s": podcast["duration_s"],
        "ratio": round(podcast["duration_s"] / podcast["requested_s"], 3),
        "wall_s": round(wall_s, 2),
        "words_per_minute": podcast["speech"]["words_per_minute"],
        "turns": len(podcast["transcript"]),
        "sources": len(podcast["sources"]),
        "wall_s_runs": [round(w, 2) for w in walls],
        "bytes": 44 + 2 * round(podcast["duration_s"] * podcast["speech"]["sample_rate"]),
        **({"note": podcast["note"]} if "note" in podcast else {}),
    }


if __name__ == "__main__":
    main()
