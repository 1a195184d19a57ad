"""Printing and saving an evaluation report."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from iris_rag.evaluation.beir import Qrels
from iris_rag.evaluation.metrics import run_scores

# The qrels file written beside the run files: what `--runs` figures are recomputed against.
QRELS_FILE = "qrels.txt"


def format_table(techniques: dict[str, dict[str, Any]]) -> str:
    """The results as a fixed-width table."""
    header = (
        f"{'technique':<20} {'nDCG@10':>8} {'R@10':>8} {'R@100':>8} {'MRR@10':>8} {'p50 ms':>9} {'p95 ms':>9}"
    )
    lines = [header, "-" * len(header)]
    for name, row in techniques.items():
        latency = row["latency_ms"]
        lines.append(
            f"{name:<20} {row['ndcg@10']:>8.4f} {row['recall@10']:>8.4f} {row['recall@100']:>8.4f} "
            f"{row['mrr@10']:>8.4f} {latency['p50']:>9.2f} {latency['p95']:>9.2f}"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """Where and when the figures were taken (latency depends on it)."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Save the report as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")


def write_run(path: Path, tag: str, rankings: dict[str, list[str]]) -> None:
    """A TREC run file (query Q0 document rank score tag): trec_eval and pytrec_eval score it as eval did.

    The score falls with the rank, so a tool that sorts by score sees eval's order exactly.
    """
    lines = [
        f"{query} Q0 {document} {rank} {score:.0f} {tag}\n"
        for query, scored in run_scores(rankings).items()
        for rank, (document, score) in enumerate(scored.items(), start=1)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")


def write_qrels(path: Path, qrels: Qrels) -> None:
    """The judgments scored, in TREC's qrels format (query 0 document grade)."""
    lines = [
        f"{query} 0 {document} {grade}\n" for query, docs in qrels.items() for document, grade in docs.items()
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
