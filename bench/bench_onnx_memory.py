"""ONNX Runtime's peak memory and speed against the rows of one forward pass (ATTENTION_CELLS_PER_RUN).

The texts are bench_large_document's: the 100 KB document's chunks (SciFact abstracts joined, 1,000
characters each, about 230 word pieces), and, for short texts, its sentences.

    .venv/bin/python -m bench.bench_onnx_memory memory [--cells N] [--out FILE]
    .venv/bin/python -m bench.bench_onnx_memory speed [--rounds 5] [--out FILE]

memory: one process per setting (ru_maxrss is the process's): the growth of peak resident memory while the
embedder (onnx backend) encodes the chunks in bulk, as an ingest does, after a warm-up. `--cells 0`: no cap,
every slice's rows in one pass (before). speed: the capped and the uncapped pass on the same session in one
process, taking turns (order alternating), on the chunks and on the sentences; medians and their ratio.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import SCIFACT, local_embedder, machine, read_jsonl, write
from iris_rag import onnx_model
from iris_rag.embedder import BULK_SLICE_CHARS, cpu_threads, resolve_model_path
from iris_rag.ingestion.chunking import chunk_text
from iris_rag.settings import Settings
from iris_rag.text import embedding_text

UNCAPPED = 1 << 40


def document_texts(kb: int) -> tuple[list[str], list[str]]:
    """The chunk texts and the sentences of bench_large_document's document of `kb` thousand characters."""
    parts: list[str] = []
    for record in read_jsonl(SCIFACT / "corpus.jsonl"):
        parts.append(record["text"])
        if sum(map(len, parts)) + len(parts) >= kb * 1000:
            break
    content = "\n".join(parts)[: kb * 1000]
    settings = Settings()
    spans = chunk_text(content, size=settings.chunk_size, overlap=settings.chunk_overlap)
    chunks = [embedding_text("Large document", span.text) for span in spans]
    sentences = [s.strip() + "." for s in content.replace("\n", " ").split(". ") if s.strip()]
    return chunks, sentences


def main() -> None:
    """Measure one setting's peak memory, or both settings' speed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["memory", "speed"])
    parser.add_argument("--kb", type=int, default=100)
    parser.add_argument(
        "--cells", type=int, default=None, help="memory: the cap (0: none; default: the code's)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args()
    chunks, sentences = document_texts(args.kb)
    result = _memory(chunks, args.cells) if args.mode == "memory" else _speed(chunks, sentences, args.rounds)
    write(args.out, {"benchmark": f"onnx_{args.mode}", "kb": args.kb, **result, "machine": machine()})


def _memory(chunks: list[str], cells: int | None) -> dict[str, Any]:
    if cells is not None:
        onnx_model.ATTENTION_CELLS_PER_RUN = cells or UNCAPPED
    embedder = local_embedder(Settings(EMBEDDING_BACKEND="onnx"))
    embedder.load()
    embedder.encode(["warm-up " * 100] * 8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    embedder.encode(chunks, bulk=True)
    encode_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    embedder.close()
    return {
        "attention_cells_per_run": onnx_model.ATTENTION_CELLS_PER_RUN,
        "chunks": len(chunks),
        "encode_s": round(encode_s, 2),
        "rss_before_mb": before // 1024,
        "rss_peak_growth_mb": (peak - before) // 1024,
    }


def _speed(chunks: list[str], sentences: list[str], rounds: int) -> dict[str, Any]:
    path = resolve_model_path(Settings().embedding_model)
    export = onnx_model.find_export(path)
    assert export is not None, "no ONNX export: run `python -m iris_rag.embedder export-onnx` first"
    model = onnx_model.OnnxModel(path, export, threads=cpu_threads())
    capped = onnx_model.ATTENTION_CELLS_PER_RUN
    settings = {"capped": capped, "uncapped": UNCAPPED}
    by_texts: dict[str, Any] = {}
    for name, texts in (("chunks", chunks), ("sentences", sentences)):
        texts = sorted(texts, key=len)  # as the embedder's bulk path, in its slices
        rates: dict[str, list[float]] = {setting: [] for setting in settings}
        model.encode(texts[-16:])  # warm-up
        for round_ in range(rounds):
            order = list(settings) if round_ % 2 == 0 else list(reversed(settings))
            for setting in order:
                onnx_model.ATTENTION_CELLS_PER_RUN = settings[setting]
                started = time.perf_counter()
                for part in _slices(texts):
                    model.encode(part, batch_size=64)
                rates[setting].append(len(texts) / (time.perf_counter() - started))
        onnx_model.ATTENTION_CELLS_PER_RUN = capped
        medians = {setting: statistics.median(values) for setting, values in rates.items()}
        by_texts[name] = {
            "texts": len(texts),
            "per_s": {setting: round(value, 1) for setting, value in medians.items()},
            "ratio_capped_to_uncapped": round(medians["capped"] / medians["uncapped"], 3),
            "runs": {setting: [round(value, 1) for value in values] for setting, values in rates.items()},
        }
    return {"attention_cells_per_run": capped, "rounds": rounds, "texts": by_texts}


def _slices(texts: list[str]) -> list[list[str]]:
    """The embedder's bulk slices: consecutive texts up to BULK_SLICE_CHARS characters."""
    slices: list[list[str]] = [[]]
    filled = 0
    for text in texts:
        if filled >= BULK_SLICE_CHARS:
            slices.append([])
            filled = 0
        slices[-1].append(text)
        filled += len(text)
    return slices


if __name__ == "__main__":
    main()
