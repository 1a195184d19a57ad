"""Printing and saving an evaluation report."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson


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
