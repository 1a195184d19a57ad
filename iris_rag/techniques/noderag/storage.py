"""The storage contract of rag_noderag: every document's node tree and its leaf vectors, per collection.

A backend implements NodeTreeStorage (backends/<backend>/noderag.py) and creates its tables when the storage
object is made. Writes and deletes made from NodeTreeIndex.write/delete join the store's open transaction,
so the trees commit or roll back with their documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from iris_rag.stores.appended import Column

NodeKind = Literal["document", "section", "paragraph", "sentence"]
Vectors = npt.NDArray[np.float32]


@dataclass(slots=True)
class Node:
    """One node of a document's tree; `node_id` is its place in pre-order (the document is 0)."""

    node_id: int
    kind: NodeKind
    level: int
    start: int
    end: int
    label: str = ""
    heading_level: int = 0
    parent_id: int | None = None
    children: list[int] = field(default_factory=list)
    prev_id: int | None = None
    next_id: int | None = None
    position: int = 0
    key_sentence_id: int | None = None
    code: bool = False

    def text(self, content: str) -> str:
        """The node's text in the document."""
        return content[self.start : self.end]


@dataclass(frozen=True, slots=True)
class DocumentTree:
    """One document's tree: its nodes in pre-order and the vectors of its leaves (sentences) in node order."""

    document_id: str
    nodes: list[Node]
    vectors: Vectors


@dataclass(frozen=True)
class LeafMatrix:
    """A collection's leaf vectors as one matrix, one row per leaf, with the leaf's document and parent."""

    document_ids: list[str]
    node_ids: npt.NDArray[np.int64]
    parent_ids: npt.NDArray[np.int64]
    matrix: Vectors
    # The storage `matrix` views, shared with the versions made from this one (appended.Column).
    rows: Column | None = field(default=None, compare=False, repr=False)

    def replaced(self, documents: set[str], fresh: LeafMatrix) -> LeafMatrix:
        """A new version: the rows of `documents` dropped, `fresh` (those documents' leaves now) appended.

        The rows stay in the order a fresh read gives (written order: a rewritten document's rows are new
        rows). Without a row to drop, the newest version appends in place to the matrix it shares.
        """
        untouched = documents.isdisjoint(self.document_ids)  # (a scan of every row: once)
        if not len(fresh.document_ids) and untouched:
            return self
        if not len(self.document_ids):
            return fresh
        if untouched:
            kept, size = self, len(self.document_ids)
            rows = self.rows if self.rows is not None else Column(self.matrix)
        else:
            keep = np.fromiter(
                (d not in documents for d in self.document_ids), dtype=bool, count=len(self.document_ids)
            )
            kept = LeafMatrix(
                [d for d, wanted in zip(self.document_ids, keep, strict=True) if wanted],
                self.node_ids[keep],
                self.parent_ids[keep],
                self.matrix[keep],
            )
            size = len(kept.document_ids)
            rows = Column(kept.matrix)
        if not len(fresh.document_ids):
            return kept
        rows, matrix = rows.extended(size, fresh.matrix)
        return LeafMatrix(
            kept.document_ids + fresh.document_ids,
            np.concatenate([kept.node_ids, fresh.node_ids]),
            np.concatenate([kept.parent_ids, fresh.parent_ids]),
            matrix,
            rows,
        )


@dataclass(frozen=True, slots=True)
class NodeTreeTotals:
    """Counts over every collection, for health details."""

    documents: int
    nodes: int
    leaves: int


class NodeTreeStorage(Protocol):
    """The node trees of a store's collections."""

    def write_trees(self, collection_id: str, trees: list[DocumentTree]) -> None:
        """Store these documents' trees (none of them may have one already: a duplicate raises)."""

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Remove a document's tree, if it has one."""

    def leaves(self, collection_id: str, document_ids: set[str] | None = None) -> LeafMatrix:
        """Every leaf of the collection (or of these documents), in the order written.

        The order written is document by document, node order within. No leaf gives a 0 x 0 matrix.
        """

    def document_trees(self, collection_id: str, document_ids: list[str]) -> dict[str, DocumentTree]:
        """The stored trees of those of the given documents that have one."""

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents have a tree."""

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents that have a tree."""

    def totals(self) -> NodeTreeTotals:
        """Documents, nodes and leaves stored, over every collection."""


# A node as a table row, in this column order in every backend (after collection_id and document_id).
NODE_COLUMNS = (
    "node_id",
    "kind",
    "level",
    "heading_level",
    "label",
    "parent_id",
    "children",
    "prev_id",
    "next_id",
    "position",
    "start_char",
    "end_char",
    "key_sentence_id",
    "code",
    "embedding",
)


def node_rows(tree: DocumentTree) -> list[tuple[Any, ...]]:
    """The tree's nodes as NODE_COLUMNS values; a leaf carries its vector as float32 bytes, others None.

    `children` is a list of ints and `code` a bool: each backend adapts them to its column types.
    """
    rows: list[tuple[Any, ...]] = []
    leaf = 0
    for node in tree.nodes:
        vector = None
        if node.kind == "sentence":
            vector = np.ascontiguousarray(tree.vectors[leaf], dtype=np.float32).tobytes()
            leaf += 1
        rows.append(
            (
                node.node_id,
                node.kind,
                node.level,
                node.heading_level,
                node.label,
                node.parent_id,
                node.children,
                node.prev_id,
                node.next_id,
                node.position,
                node.start,
                node.end,
                node.key_sentence_id,
                node.code,
                vector,
            )
        )
    return rows


def node_from_row(row: tuple[Any, ...] | Any, children: list[int]) -> Node:
    """A Node from NODE_COLUMNS values (children already decoded by the backend)."""
    return Node(
        node_id=row[0],
        kind=row[1],
        level=row[2],
        heading_level=row[3],
        label=row[4],
        parent_id=row[5],
        children=children,
        prev_id=row[7],
        next_id=row[8],
        position=row[9],
        start=row[10],
        end=row[11],
        key_sentence_id=row[12],
        code=bool(row[13]),
    )


def tree_from_rows(document_id: str, nodes: list[Node], leaf_vectors: list[bytes]) -> DocumentTree:
    """A document's tree from its nodes in order and its leaves' float32 bytes."""
    matrix = np.frombuffer(b"".join(leaf_vectors), dtype=np.float32).reshape(len(leaf_vectors), -1)
    return DocumentTree(document_id, nodes, matrix)
