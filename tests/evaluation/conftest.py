"""A BEIR folder writer for the evaluation tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_beir(
    root: Path,
    corpus: list[dict[str, Any]],
    queries: dict[str, str],
    qrels: list[tuple[str, str, int]],
    *,
    split: str = "test",
) -> Path:
    """Write corpus.jsonl, queries.jsonl and qrels/<split>.tsv (with BEIR's header) under root."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(doc) for doc in corpus]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = [json.dumps({"_id": qid, "text": text}) for qid, text in queries.items()]
    (root / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in qrels)]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root
