"""The node tree: its shape for markdown and plain text, key sentences, rows that follow the documents."""

import sqlite3
from typing import Any

import numpy as np
import psycopg
import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.service import RagService
from iris_rag.stores.base import DocumentInput
from iris_rag.techniques.noderag.index import (
    MAX_SENTENCE_CHARS,
    NodeTreeIndex,
    ancestors,
    build_tree,
    choose_key_sentences,
    leaf_texts,
    subtree_end,
)
from iris_rag.techniques.noderag.storage import Node

MARKDOWN = """Aspirin is an old drug. It came from willow bark.

# Benefits
Low-dose aspirin prevents heart attacks. The effect is largest in older adults.

Trials also saw fewer strokes.

## Dosing
```
# not a heading

dose = 75  # mg
```
The usual dose is 75 mg a day.

# Harms
Aspirin raises the risk of bleeding.
"""

PLAIN = (
    "Lava flows downhill. It cools into basalt.\n\nAsh clouds travel far.\nThey ground planes.\n\n\n"
    "Magma rises."
)


def shape(nodes: list[Node], content: str) -> list[tuple[int, str, str]]:
    return [(n.level, n.kind, n.label or n.text(content)) for n in nodes]


def by_text(nodes: list[Node], content: str, text: str) -> Node:
    return next(n for n in nodes if n.text(content) == text)


def test_markdown_tree_nests_sections_by_heading_level() -> None:
    nodes = build_tree(MARKDOWN, "Aspirin")
    assert shape(nodes, MARKDOWN) == [
        (0, "document", "Aspirin"),
        (1, "section", "Aspirin is an old drug. It came from willow bark."),  # the text before any heading
        (2, "paragraph", "Aspirin is an old drug. It came from willow bark."),
        (3, "sentence", "Aspirin is an old drug."),
        (3, "sentence", "It came from willow bark."),
        (1, "section", "Benefits"),
        (2, "paragraph", "Low-dose aspirin prevents heart attacks. The effect is largest in older adults."),
        (3, "sentence", "Low-dose aspirin prevents heart attacks."),
        (3, "sentence", "The effect is largest in older adults."),
        (2, "paragraph", "Trials also saw fewer strokes."),
        (3, "sentence", "Trials also saw fewer strokes."),
        (2, "section", "Dosing"),
        (3, "paragraph", "```\n# not a heading\n\ndose = 75  # mg\n```"),  # a fence stays whole
        (4, "sentence", "```\n# not a heading\n\ndose = 75  # mg\n```"),
        (3, "paragraph", "The usual dose is 75 mg a day."),
        (4, "sentence", "The usual dose is 75 mg a day."),
        (1, "section", "Harms"),
        (2, "paragraph", "Aspirin raises the risk of bleeding."),
        (3, "sentence", "Aspirin raises the risk of bleeding."),
    ]
    benefits, dosing, harms = (
        next(n for n in nodes if n.label == label) for label in ("Benefits", "Dosing", "Harms")
    )
    assert (
        [n.node_id for n in nodes if n.parent_id == 0]
        == nodes[0].children
        == [1, benefits.node_id, harms.node_id]
    )
    assert benefits.children == [6, 9, dosing.node_id] and dosing.parent_id == benefits.node_id
    assert (dosing.heading_level, benefits.heading_level) == (2, 1)
    # Siblings: previous and next among the parent's children, whatever their kind.
    assert (benefits.prev_id, benefits.next_id, harms.prev_id, harms.next_id) == (1, 16, 5, None)
    assert (nodes[9].prev_id, nodes[9].next_id, dosing.prev_id, dosing.next_id) == (6, 11, 9, None)
    assert (nodes[7].prev_id, nodes[7].next_id, nodes[8].prev_id, nodes[8].next_id) == (None, 8, 7, None)
    assert [nodes[c].position for c in benefits.children] == [0, 1, 2]
    # Offsets: a section spans its heading and everything up to the next heading of its level or higher.
    assert dosing.text(MARKDOWN).startswith("## Dosing") and dosing.text(MARKDOWN).endswith("75 mg a day.")
    assert benefits.text(MARKDOWN).startswith("# Benefits") and benefits.end == dosing.end
    assert subtree_end(nodes, benefits.node_id) == harms.node_id
    assert [a.node_id for a in ancestors(nodes, 15)] == [14, dosing.node_id, benefits.node_id, 0]
    for node in nodes:
        for child in node.children:
            assert node.start <= nodes[child].start <= nodes[child].end <= node.end


def test_plain_document_sections_are_blank_line_blocks() -> None:
    nodes = build_tree(PLAIN, "Volcanoes")
    assert shape(nodes, PLAIN) == [
        (0, "document", "Volcanoes"),
        (1, "section", "Lava flows downhill. It cools into basalt."),
        (2, "paragraph", "Lava flows downhill. It cools into basalt."),
        (3, "sentence", "Lava flows downhill."),
        (3, "sentence", "It cools into basalt."),
        (1, "section", "Ash clouds travel far.\nThey ground planes."),  # one newline does not split
        (2, "paragraph", "Ash clouds travel far.\nThey ground planes."),
        (3, "sentence", "Ash clouds travel far."),
        (3, "sentence", "They ground planes."),
        (1, "section", "Magma rises."),
        (2, "paragraph", "Magma rises."),
        (3, "sentence", "Magma rises."),
    ]
    assert nodes[0].children == [1, 5, 9]
    assert [(nodes[i].prev_id, nodes[i].next_id) for i in (1, 5, 9)] == [(None, 5), (1, 9), (5, None)]
    assert nodes[5].children == [6] and nodes[6].children == [7, 8] and nodes[8].parent_id == 6
    assert all(
        PLAIN[n.start : n.end] == n.text(PLAIN) and n.text(PLAIN).strip() == n.text(PLAIN) for n in nodes
    )


def test_long_sentences_are_cut_and_leaves_carry_title_and_headings() -> None:
    long = "word " * 500 + "end."
    nodes = build_tree(long, "")
    leaves = [n for n in nodes if n.kind == "sentence"]
    assert len(leaves) >= 3 and all(n.end - n.start <= MAX_SENTENCE_CHARS for n in leaves)
    assert " ".join(n.text(long) for n in leaves).split() == long.split()

    markdown = build_tree(MARKDOWN, "Aspirin")
    texts = leaf_texts("Aspirin", MARKDOWN, markdown)
    assert texts[0] == "Aspirin\nAspirin is an old drug."
    assert "Aspirin > Benefits > Dosing\nThe usual dose is 75 mg a day." in texts
    assert leaf_texts("", PLAIN, build_tree(PLAIN))[0] == "Lava flows downhill."


def test_key_sentence_is_the_leaf_nearest_the_centroid() -> None:
    nodes = build_tree("One. Two. Three.\n\nFour.", "")
    vectors = np.array([[1, 0, 0], [0.6, 0.8, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    choose_key_sentences(nodes, vectors)
    leaves = [n.node_id for n in nodes if n.kind == "sentence"]
    first_paragraph = nodes[2]
    assert first_paragraph.key_sentence_id == leaves[1], "Two sits between One and Three"
    assert nodes[6].key_sentence_id == leaves[3], "a one-sentence paragraph is its own key sentence"
    assert nodes[0].key_sentence_id is not None


def _rows(service: RagService, document_ids: list[str]) -> dict[str, tuple[int, int]]:
    """Document -> (nodes, leaves) of the trees stored for the asked ids, through the storage contract."""
    trees = _index(service).document_trees("docs", document_ids)
    return {document_id: (len(tree.nodes), len(tree.vectors)) for document_id, tree in trees.items()}


def _index(service: RagService) -> NodeTreeIndex:
    index = service.pipelines["noderag"].technique_index()
    assert isinstance(index, NodeTreeIndex)
    return index


def test_index_follows_ingest_replace_and_delete(any_service: RagService) -> None:
    documents: list[dict[str, Any]] = [
        {"id": "md", "title": "Aspirin", "content": MARKDOWN},
        {"id": "plain", "title": "Volcanoes", "content": PLAIN},
    ]
    service = any_service
    service.ingest({"collection_id": "docs", "documents": documents})
    store = service.store
    index = _index(service)
    assert _rows(service, ["md", "plain"]) == {"md": (19, 8), "plain": (12, 5)}
    assert index.indexed_documents("docs") == 2
    collection = store.get_collection("docs")
    assert collection is not None
    matrix = index.leaf_matrix("docs", collection.version)
    assert matrix.matrix.shape == (13, 384) and sorted(set(matrix.document_ids)) == ["md", "plain"]
    stored = index.document_trees("docs", ["md"])["md"]
    assert shape(stored.nodes, MARKDOWN) == shape(build_tree(MARKDOWN, "Aspirin"), MARKDOWN)
    assert stored.nodes[5].children == [6, 9, 11] and stored.nodes[9].prev_id == 6
    assert stored.vectors.shape == (8, 384)

    service.ingest({"collection_id": "docs", "documents": [{"id": "plain", "content": "Only one sentence."}]})
    assert _rows(service, ["md", "plain"]) == {"md": (19, 8), "plain": (4, 1)}, (
        "replacing a document replaces its nodes"
    )
    collection = store.get_collection("docs")
    assert collection is not None
    refreshed = index.leaf_matrix("docs", collection.version)
    assert refreshed is not matrix and refreshed.matrix.shape == (9, 384)

    assert store.delete_document("docs", "md")
    assert _rows(service, ["md", "plain"]) == {"plain": (4, 1)}
    assert index.indexed_documents("docs") == 1
    stats = store.stats()["technique_indexes"]["node_tree"]
    assert (stats["documents"], stats["nodes"], stats["leaves"]) == (1, 4, 1)


def test_reindex_reuses_cached_leaf_vectors(service: RagService) -> None:
    service.ingest(
        {"collection_id": "docs", "documents": [{"id": "md", "title": "Aspirin", "content": MARKDOWN}]}
    )
    store = service.store
    assert isinstance(store, SqliteStore)
    connection = store.connection()
    cached = connection.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0]
    before = connection.execute("SELECT embedding FROM node_tree_nodes WHERE node_id = 15").fetchone()[0]
    summary = service.reindex("docs")
    assert summary["documents"] == 1
    assert connection.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0] == cached
    assert (
        connection.execute("SELECT embedding FROM node_tree_nodes WHERE node_id = 15").fetchone()[0] == before
    )


def test_a_failed_ingest_leaves_the_tree_untouched(any_service: RagService) -> None:
    service = any_service
    service.ingest(
        {"collection_id": "docs", "documents": [{"id": "md", "title": "Aspirin", "content": MARKDOWN}]}
    )
    store = service.store
    index = _index(service)
    prepared = index.prepare("docs", [])
    assert prepared == []
    with pytest.raises((sqlite3.IntegrityError, psycopg.IntegrityError)):
        # Writing the same document's nodes twice in one transaction violates the primary key: all rolls back.
        tree = index.prepare("docs", [_input("x")])
        store.upsert_documents("docs", [_input("x")], {"node_tree": tree + tree})
    assert _rows(service, ["md", "x"]) == {"md": (19, 8)}
    assert store.get_document("docs", "x") is None


def _input(document_id: str) -> DocumentInput:
    return DocumentInput(document_id, "T", "Some text. More text.", {}, [])
