"""Seconds from spawning the MCP server to its first rag_basic answer, per embedding backend (issue 15.6).

Each run starts the real server (`node mcp-server/dist/index.js`, which spawns the Python worker) with
EMBEDDING_BACKEND set, speaks bare JSON-RPC over stdio (initialize, then tools/call rag_basic on the
bundled sample, ingested once beforehand) and stops the clock at the answer. Runs alternate between the
backends, so the drift of a shared machine hits both alike; the figures are medians and the same-run ratio.

The breakdown runs each backend's load steps in a fresh Python process (the OS file cache warm, as for the
server): importing the worker's own modules, the backend's libraries, the weights, the first forward pass.

    .venv/bin/python -m bench.bench_first_answer [--runs 5] [--backends torch,onnx] [--out FILE]
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

import orjson

from bench.common import ROOT, SAMPLE, machine, median, read_jsonl, write

COLLECTION = "bench"
QUERY = "What is the role of insulin resistance in type 2 diabetes?"


def first_answer_s(data_dir: Path, backend: str) -> float:
    """Spawn the MCP server, initialize, call rag_basic; seconds from spawn to the answer."""
    from bench.bench_latency import JsonLinesProcess

    os.environ["EMBEDDING_BACKEND"] = backend  # JsonLinesProcess passes this process's environment on
    started = time.perf_counter()
    server = JsonLinesProcess(["node", str(ROOT / "mcp-server" / "dist" / "index.js")], data_dir)
    try:
        server.request(
            {
                "jsonrpc": "2.0",
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"},
                },
            }
        )
        server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        arguments = {"query": QUERY, "collection_id": COLLECTION, "options": {"top_k": 5}}
        response = server.request(
            {
                "jsonrpc": "2.0",
                "method": "tools/call",
                "params": {"name": "rag_basic", "arguments": arguments},
            }
        )
        elapsed = time.perf_counter() - started
        result = response["result"]
        assert not result.get("isError"), result
        assert result["structuredContent"]["retrieved_documents"], "the answer retrieved nothing"
        return elapsed
    finally:
        server.close()
        os.environ.pop("EMBEDDING_BACKEND", None)


def breakdown(backend: str) -> dict[str, float]:
    """Seconds of each load step, in this (fresh) process."""
    steps: dict[str, float] = {}
    mark = time.perf_counter()

    def step(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        steps[name] = round(now - mark, 3)
        mark = now

    import iris_rag.worker.server  # noqa: F401  (the worker's own modules: stores, techniques, schemas)

    step("import_worker_modules")
    from iris_rag.embedder import resolve_model_path
    from iris_rag.settings import PACKAGED_MODEL_NAME

    path = resolve_model_path(PACKAGED_MODEL_NAME)
    if backend == "torch":
        import torch  # noqa: F401

        step("import_torch")
        from sentence_transformers import SentenceTransformer

        step("import_sentence_transformers")
        model: Any = SentenceTransformer(path, device="cpu")
        step("load_weights")
    else:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401

        from iris_rag import onnx_model

        step("import_onnxruntime_tokenizers")
        onnx_path = onnx_model.find_export(path)
        assert onnx_path is not None, "no ONNX export: run `python -m iris_rag.embedder export-onnx`"
        model = onnx_model.OnnxModel(path, onnx_path, threads=os.cpu_count() or 1)
        step("load_weights")
    model.encode([QUERY], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    step("first_forward")
    model.encode(
        [QUERY + " again"], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    step("second_forward")
    steps["total"] = round(sum(v for k, v in steps.items() if k != "second_forward"), 3)
    return steps


def breakdown_in_child(backend: str) -> dict[str, float]:
    """breakdown() in a fresh interpreter, so no import is already done."""
    output = subprocess.run(
        [sys.executable, "-m", "bench.bench_first_answer", "--child-breakdown", backend],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "LOG_LEVEL": "WARNING"},
    ).stdout
    result: dict[str, float] = orjson.loads(output.splitlines()[-1])
    return result


def main() -> None:
    """Alternate the backends' first answers and breakdowns; print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backends", default="torch,onnx")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / ".data" / "first-answer")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child-breakdown", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_breakdown:
        print(json.dumps(breakdown(args.child_breakdown)))
        return
    from bench.bench_latency import prepare  # not imported by the breakdown's child: it times imports

    backends = args.backends.split(",")
    prepare(args.data_dir, SAMPLE / "corpus.jsonl", COLLECTION)
    load_before = round(os.getloadavg()[0], 2)  # the machine is shared: say how busy it was
    answers: dict[str, list[float]] = {b: [] for b in backends}
    steps: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    for run in range(args.runs):
        for backend in backends if run % 2 == 0 else backends[::-1]:
            answers[backend].append(first_answer_s(args.data_dir, backend))
            steps[backend].append(breakdown_in_child(backend))
            print(f"run {run + 1}: {backend} {answers[backend][-1]:.2f}s", file=sys.stderr)
    result: dict[str, Any] = {
        "benchmark": "spawn of the MCP server -> first rag_basic answer (s), sample collection",
        "corpus": str(SAMPLE / "corpus.jsonl"),
        "documents": len(read_jsonl(SAMPLE / "corpus.jsonl")),
        "first_answer_s": {
            b: {"median": median(answers[b]), "runs": [round(t, 2) for t in answers[b]]} for b in backends
        },
        "breakdown_median_s": {
            b: {name: median([s[name] for s in steps[b]]) for name in steps[b][0]} for b in backends
        },
        "load_average_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "machine": machine(),
    }
    if "torch" in answers and "onnx" in answers:
        ratios = [t / o for t, o in zip(answers["torch"], answers["onnx"], strict=True)]
        result["torch_over_onnx_median_ratio"] = median(ratios)
    write(args.out, result)


if __name__ == "__main__":
    main()
