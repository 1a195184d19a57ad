"""Defect 10: the CPU stages of an ingest do work linear in a document's size (counted, not timed).

Work is the number of Python lines executed in iris_rag while chunking a document, building its NodeRAG
tree and extracting and placing its graph (the model's work is linear by construction: texts in slices).
Doubling the document must at most about double it; before the fix the graph extraction, the placement
of sentences in chunks and the section ends of a markdown tree grew with the square of the size.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

import iris_rag
from iris_rag.ingestion.chunking import chunk_text
from iris_rag.stores.base import ChunkInput, DocumentInput
from iris_rag.techniques.graphrag.extraction import RuleExtractor
from iris_rag.techniques.graphrag.index import _unit_chunks
from iris_rag.techniques.noderag.index import build_tree, choose_key_sentences, leaf_texts
from tests.conftest import SAMPLE_CORPUS

PACKAGE = str(Path(iris_rag.__file__).parent)


GLOSSARY = [
    ("tumour necrosis factor", "TNF"),
    ("body mass index", "BMI"),
    ("confidence interval", "CI"),
    ("hazard ratio", "HR"),
    ("randomized controlled trial", "RCT"),
    ("reactive oxygen species", "ROS"),
]


def _document(characters: int, *, kind: str) -> str:
    """Real sentences (the sample corpus's abstracts) or a markdown glossary of abbreviations."""
    parts: list[str] = []
    length = 0
    with SAMPLE_CORPUS.open(encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines]
    while length < characters:
        n = len(parts)
        if kind == "abstracts":
            part = records[n % len(records)]["text"] + "\n"
        else:  # each sentence defines an abbreviation, each section has a heading
            long, short = GLOSSARY[n % len(GLOSSARY)]
            part = f"## Entry {n}\n\nThe {long} ({short}) was reported in study {n}.\n\n"
        parts.append(part)
        length += len(part)
    return "".join(parts)[:characters]


def _lines_executed(work: Callable[[], Any]) -> int:
    """How many lines of iris_rag's own code `work` executes."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def scope(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    sys.settrace(scope)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def _ingest_cpu_stages(content: str) -> None:
    spans = chunk_text(content, size=1000, overlap=200)
    nodes = build_tree(content, "Title")
    texts = leaf_texts("Title", content, nodes)
    choose_key_sentences(nodes, np.ones((len(texts), 4), dtype=np.float32))
    graph = RuleExtractor().extract("Title", content)
    vector = np.zeros(4, dtype=np.float32)
    chunks = [ChunkInput(i, s.text, s.start, s.end, vector) for i, s in enumerate(spans)]
    _unit_chunks(graph.units, DocumentInput("d", "Title", content, {}, chunks))


@pytest.mark.parametrize("kind", ["abstracts", "glossary"])
def test_doubling_a_document_at_most_doubles_the_ingest_work(kind: str) -> None:
    small = _lines_executed(lambda: _ingest_cpu_stages(_document(60_000, kind=kind)))
    large = _lines_executed(lambda: _ingest_cpu_stages(_document(120_000, kind=kind)))
    assert large / small < 2.3, f"{small} -> {large} lines: grows faster than the document"
