"""The encoder's backends on the same texts in the same run: torch, ONNX Runtime fp32, and an int8 study.

For each backend (sentence-transformers on torch; the install-time ONNX export on ONNX Runtime; that
export quantized to int8 weights with onnxruntime's dynamic quantization, made here in a temporary folder):

1. agreement with torch: the lowest cosine over every document and query embedding, and the share of
   queries whose top 10 documents come in the same order;
2. latency: one query at a time on one thread (as the worker's query thread runs it), and bulk batches of
   64 documents on every core; the backends take turns on each query and each batch, order alternating,
   so the drift of a shared machine hits all alike. Medians, and the medians of same-item ratios;
3. quality: nDCG@10 of dense retrieval over whole documents (title and text, as embedding_text joins them)
   against the dataset's qrels: the bundled sample (300 documents, 60 queries) unless --dataset names a
   BEIR folder (e.g. ../shared/data/scifact: 5,183 documents, 300 test queries).

    .venv/bin/python -m bench.bench_encoder [--dataset DIR] [--backends torch,onnx,int8] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import SAMPLE, machine, median, read_jsonl, write
from iris_rag import onnx_model
from iris_rag.embedder import cpu_threads, resolve_model_path
from iris_rag.settings import PACKAGED_MODEL_NAME
from iris_rag.text import embedding_text

Vectors = npt.NDArray[np.float32]
Encode = Callable[[list[str]], Vectors]
BULK_BATCH = 64


def dataset(folder: Path | None) -> tuple[list[str], list[str], list[str], dict[str, set[str]]]:
    """Document ids, document texts, query texts and each query's relevant documents (by query text)."""
    if folder is None:
        documents = read_jsonl(SAMPLE / "corpus.jsonl")
        queries = read_jsonl(SAMPLE / "queries.jsonl")
        relevant = {q["text"]: set(q["relevant"]) for q in queries}
    else:
        documents = read_jsonl(folder / "corpus.jsonl")
        by_id = {q["_id"]: q["text"] for q in read_jsonl(folder / "queries.jsonl")}
        relevant = {}
        with (folder / "qrels" / "test.tsv").open(encoding="utf-8") as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                if int(row["score"]) > 0 and row["query-id"] in by_id:
                    relevant.setdefault(by_id[row["query-id"]], set()).add(row["corpus-id"])
    ids = [str(d["_id"]) for d in documents]
    texts = [embedding_text(d.get("title", ""), d["text"]) for d in documents]
    return ids, texts, sorted(relevant), relevant


def backends(names: list[str], folder: Path) -> dict[str, tuple[Encode, Encode]]:
    """Each backend's (one-query encode on one thread, bulk encode on every core)."""
    model_path = resolve_model_path(PACKAGED_MODEL_NAME)
    threads = cpu_threads()
    built: dict[str, tuple[Encode, Encode]] = {}
    for name in names:
        if name == "torch":
            import torch
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(model_path, device="cpu")

            def torch_encode(texts: list[str], count: int, model: Any = model) -> Vectors:
                torch.set_num_threads(count)
                vectors: Vectors = model.encode(
                    texts, batch_size=BULK_BATCH, normalize_embeddings=True, convert_to_numpy=True
                )
                return vectors

            built[name] = (
                functools.partial(torch_encode, count=1),
                functools.partial(torch_encode, count=threads),
            )
            continue
        exported = onnx_model.find_export(model_path)
        if exported is None:
            sys.exit("no ONNX export: run `python -m iris_rag.embedder export-onnx` first")
        if name == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantized = folder / "model.int8.onnx"
            quantize_dynamic(str(exported), str(quantized), weight_type=QuantType.QInt8)
            exported = quantized
        elif name != "onnx":
            sys.exit(f"unknown backend {name!r}: torch, onnx or int8")
        single = onnx_model.OnnxModel(model_path, exported, threads=1)
        bulk = onnx_model.OnnxModel(model_path, exported, threads=threads)
        built[name] = (
            functools.partial(single.encode, batch_size=BULK_BATCH),
            functools.partial(bulk.encode, batch_size=BULK_BATCH),
        )
    return built


def ndcg_at_10(ranked: list[list[str]], queries: list[str], relevant: dict[str, set[str]]) -> float:
    """Mean nDCG@10 with binary gains (SciFact's qrels are all 1)."""
    scores = []
    for query, ids in zip(queries, ranked, strict=True):
        gains = [1.0 if doc in relevant[query] else 0.0 for doc in ids[:10]]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
        ideal = sum(1 / math.log2(i + 2) for i in range(min(10, len(relevant[query]))))
        scores.append(dcg / ideal if ideal else 0.0)
    return round(statistics.fmean(scores), 4)


def timed(encode: Encode, texts: list[str]) -> tuple[Vectors, float]:
    """The vectors and the milliseconds they took."""
    started = time.perf_counter()
    vectors = encode(texts)
    return vectors, (time.perf_counter() - started) * 1000


def main() -> None:
    """Encode the dataset with every backend in turns; print agreement, latency and nDCG@10."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--dataset", type=Path, default=None, help="a BEIR folder; default: the bundled sample"
    )
    parser.add_argument("--backends", default="torch,onnx,int8")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = args.backends.split(",")
    ids, texts, queries, relevant = dataset(args.dataset)
    with tempfile.TemporaryDirectory() as folder:
        encoders = backends(names, Path(folder))
        for single, bulk in encoders.values():  # warm: the first call of each pays one-time costs
            single(["warm up"])
            bulk(texts[:8])
        # Bulk: each batch of documents through every backend in turn, the order alternating.
        documents: dict[str, list[Vectors]] = {n: [] for n in names}
        bulk_ms: dict[str, list[float]] = {n: [] for n in names}
        for turn, start in enumerate(range(0, len(texts), BULK_BATCH)):
            batch = texts[start : start + BULK_BATCH]
            for name in names if turn % 2 == 0 else names[::-1]:
                vectors, ms = timed(encoders[name][1], batch)
                documents[name].append(vectors)
                bulk_ms[name].append(ms)
            print(f"bulk {start + len(batch)}/{len(texts)}", file=sys.stderr)
        # Queries: one at a time, every backend in turn.
        query_vectors: dict[str, list[Vectors]] = {n: [] for n in names}
        query_ms: dict[str, list[float]] = {n: [] for n in names}
        for turn, query in enumerate(queries):
            for name in names if turn % 2 == 0 else names[::-1]:
                vectors, ms = timed(encoders[name][0], [query])
                query_vectors[name].append(vectors[0])
                query_ms[name].append(ms)
    result: dict[str, Any] = {
        "benchmark": "encoder backends, same run (torch vs ONNX Runtime fp32 vs int8 weights)",
        "dataset": str(args.dataset or SAMPLE),
        "documents": len(texts),
        "queries": len(queries),
        "threads_bulk": cpu_threads(),
        "backends": {},
        "machine": machine(),
    }
    reference = names[0]
    doc_matrix = {n: np.concatenate(documents[n]) for n in names}
    query_matrix = {n: np.stack(query_vectors[n]) for n in names}
    top10 = {
        n: np.argsort(-(query_matrix[n] @ doc_matrix[n].T), axis=1, kind="stable")[:, :10] for n in names
    }
    for name in names:
        ranked = [[ids[i] for i in row] for row in top10[name]]
        entry: dict[str, Any] = {
            "ndcg_at_10": ndcg_at_10(ranked, queries, relevant),
            "query_encode_ms_p50": median(query_ms[name]),
            "bulk_docs_per_s": round(len(texts) / (sum(bulk_ms[name]) / 1000), 1),
        }
        if name != reference:
            entry[f"min_cosine_vs_{reference}"] = round(
                float(
                    min(
                        np.min(np.sum(doc_matrix[name] * doc_matrix[reference], axis=1)),
                        np.min(np.sum(query_matrix[name] * query_matrix[reference], axis=1)),
                    )
                ),
                7,
            )
            entry[f"same_top10_order_as_{reference}"] = round(
                float(np.mean(np.all(top10[name] == top10[reference], axis=1))), 4
            )
            entry[f"query_ms_ratio_{reference}_over_this_p50"] = median(
                [r / t for r, t in zip(query_ms[reference], query_ms[name], strict=True)]
            )
            entry[f"bulk_ms_ratio_{reference}_over_this_p50"] = median(
                [r / t for r, t in zip(bulk_ms[reference], bulk_ms[name], strict=True)]
            )
        result["backends"][name] = entry
    write(args.out, result)


if __name__ == "__main__":
    main()
