"""The SQLite keyword tests' corpus: the bundled SciFact sample in a store, and a second store on its file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.stores.base import ChunkInput, DocumentInput

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "scifact"


def read(name: str) -> list[dict[str, Any]]:
    with (SAMPLE / name).open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def document(doc_id: str, title: str, text: str) -> DocumentInput:
    """The text in three chunks (more rows than documents, as chunking makes)."""
    third = max(1, len(text) // 3)
    parts = [text[i : i + third] for i in range(0, len(text), third)] or [text]
    rng = np.random.default_rng(len(text))
    chunks = [
        ChunkInput(i, part, 0, len(part), rng.normal(size=4).astype(np.float32))
        for i, part in enumerate(parts)
    ]
    return DocumentInput(doc_id, title, text, {}, chunks)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[SqliteStore, SqliteStore]]:
    """A reader and a writer store on one file holding the sample: two processes, as far as SQLite knows."""
    path = tmp_path / "db.sqlite3"
    writer = SqliteStore(path)
    writer.create_collection("c", "model", 4)
    writer.upsert_documents("c", [document(d["_id"], d["title"], d["text"]) for d in read("corpus.jsonl")])
    reader = SqliteStore(path)
    reader.get_collection("c")  # counts the chunks for this data version, as every request does
    yield reader, writer
    reader.close()
    writer.close()
