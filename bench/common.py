"""Helpers shared by the benchmarks: corpus reading, percentiles, printing."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from iris_rag.embedder import Embedder
    from iris_rag.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "scifact"
SCIFACT = ROOT.parent / "shared" / "data" / "scifact"


@contextmanager
def patched(owner: Any, **values: Any) -> Iterator[None]:
    """Attributes of a module or object set to other values while inside (a store's knobs, for a bench)."""
    previous = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(owner, name, value)


def local_embedder(settings: Settings) -> Embedder:
    """The local encoder a server with these settings runs (EMBEDDING_BACKEND, EMBEDDING_DEVICE): not loaded.

    For a bench that shares one loaded model between its fresh stores; `Embedder(model)` alone measured
    ONNX whatever EMBEDDING_BACKEND said.
    """
    from iris_rag.embedder import Embedder

    return Embedder(
        settings.embedding_model,
        batch_size=settings.embedding_batch_size,
        device=settings.embedding_device,
        backend=settings.embedding_backend,
        onnx_dir=settings.embedding_onnx_dir,
    )


def read_jsonl(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` records of a JSON-lines file."""
    records = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                records.append(json.loads(line))
            if limit is not None and len(records) >= limit:
                break
    return records


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    """Median, p95 and count of a list of milliseconds (zeros for none)."""
    if not samples_ms:
        return {"p50": 0.0, "p95": 0.0, "n": 0}
    array = np.array(samples_ms)
    return {
        "p50": round(float(np.percentile(array, 50)), 3),
        "p95": round(float(np.percentile(array, 95)), 3),
        "n": len(samples_ms),
    }


def median(values: list[float]) -> float:
    """The median, rounded for printing."""
    return round(statistics.median(values), 3)


def machine() -> dict[str, Any]:
    """Where and when the figures were taken."""
    import os

    return {
        "date": datetime.now(UTC).date().isoformat(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def write(out: Path | None, result: dict[str, Any]) -> None:
    """Print the result as JSON and save it when asked."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")


def add_query_options(
    parser: argparse.ArgumentParser,
    *,
    queries: Path | None,
    queries_limit: int,
    warmup: int | None = None,
    top_k: int | None = None,
) -> None:
    """The options every latency benchmark takes: the query file and how many, warm-up calls, top_k, output.

    `queries=None` makes --queries required; `warmup` / `top_k` None leave that option out.
    """
    if queries is None:
        parser.add_argument("--queries", type=Path, required=True, help="a BEIR queries.jsonl")
    else:
        parser.add_argument("--queries", type=Path, default=queries, help="a BEIR queries.jsonl")
    parser.add_argument("--queries-limit", type=int, default=queries_limit, help="how many of them")
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls first")
    if top_k is not None:
        parser.add_argument("--top-k", type=int, default=top_k)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
