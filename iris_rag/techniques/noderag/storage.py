"""The storage contract of rag_noderag: every document's node tree and its leaf vectors, per collection.

A backend implements NodeTreeStorage (backends/<backend>/noderag.py) and creates its tables when the storage
object is made. Writes and deletes made from NodeTreeIndex.write/delete join the store's open transaction,
so the trees commit or roll back with their documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

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

    def leaves(self, collection_id: str) -> LeafMatrix:
        """Every leaf of the collection, in the order written (document by document, node order within).

        An empty collection gives a 0 x 0 matrix.
        """

    def document_trees(self, collection_id: str, document_ids: list[str]) -> dict[str, DocumentTree]:
        """The stored trees of those of the given documents that have one."""

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents have a tree."""

    def totals(self) -> NodeTreeTotals:
        """Documents, nodes and leaves stored, over every collection."""
