"""The node tree of rag_noderag: every document as document > section > paragraph > sentence nodes.

Sections come from markdown headings (nested by heading level, so a tree can be deeper than four levels) or,
in a document without headings, from blank-line blocks; paragraphs are the blank-line blocks inside a
section (a fenced code block is one paragraph and one sentence); sentences are split as chunking splits
them. Every node keeps its parent, its children, its previous and next sibling and its character offsets
into the document's content, so any node's text is `content[start:end]`. Sentences are the leaves: they
carry a vector for scoring, and every inner node names its key sentence, the leaf nearest the centroid of
its leaves (an extractive summary chosen at ingest), which is what an ancestor contributes as context.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.embedder import Embedder
from iris_rag.stores.base import DocumentInput, DocumentStore
from iris_rag.stores.versioned import VersionedCache
from iris_rag.text import split_sentences

NodeKind = Literal["document", "section", "paragraph", "sentence"]
Vectors = npt.NDArray[np.float32]

# A sentence longer than this is cut at whitespace: the encoder reads at most 256 word pieces anyway.
MAX_SENTENCE_CHARS = 1000
# Leaves are embedded this many texts per encode call (outside the ingest transaction): the encoder sorts a
# call's texts by length, so larger calls pad less; each call's vectors go to the embedding cache.
ENCODE_BATCH = 1024

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


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
class _Line:
    start: int
    end: int
    text: str


def _lines(content: str) -> list[_Line]:
    lines: list[_Line] = []
    position = 0
    for raw in content.splitlines(keepends=True):
        body = raw.rstrip("\r\n")
        lines.append(_Line(position, position + len(body), body))
        position += len(raw)
    return lines


def _fences(lines: list[_Line]) -> list[int | None]:
    """For each line, the number of the fenced code block it belongs to (fence lines included), or None."""
    found: list[int | None] = []
    fence: str | None = None
    count = 0
    for line in lines:
        match = _FENCE.match(line.text)
        if fence is None:
            if match:
                fence, count = match.group(1), count + 1
            found.append(count if fence is not None else None)
        else:
            found.append(count)
            closing = match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence)
            if closing and not line.text.strip().strip(fence[0]):
                fence = None
    return found


class _Builder:
    """Builds one document's nodes in pre-order."""

    def __init__(self, content: str, title: str) -> None:
        self.content = content
        self.lines = _lines(content)
        self.fences = _fences(self.lines)
        self.nodes: list[Node] = [Node(0, "document", 0, 0, len(content.rstrip()), label=title)]

    def add(self, kind: NodeKind, start: int, end: int, parent: int, **extra: Any) -> int:
        node = Node(
            len(self.nodes), kind, self.nodes[parent].level + 1, start, end, parent_id=parent, **extra
        )
        self.nodes.append(node)
        self.nodes[parent].children.append(node.node_id)
        return node.node_id

    def headings(self) -> list[tuple[int, int, str]]:
        """(line index, heading level, text) of every ATX heading outside code fences."""
        found = []
        for i, line in enumerate(self.lines):
            match = None if self.fences[i] is not None else _HEADING.match(line.text)
            if match:
                found.append((i, len(match.group(1)), match.group(2).strip()))
        return found

    def blocks(self, first: int, last: int) -> list[tuple[int, int, bool]]:
        """Blank-line blocks of lines first..last-1 as (start, end, is_code); a code fence is one block."""
        found: list[tuple[int, int, bool]] = []
        block: list[int] = []

        def close() -> None:
            if block:
                start, end = self.lines[block[0]].start, self.lines[block[-1]].end
                text = self.content[start:end]
                if text.strip():
                    start += len(text) - len(text.lstrip())
                    end -= len(text) - len(text.rstrip())
                    found.append((start, end, self.fences[block[0]] is not None))
                block.clear()

        for i in range(first, last):
            fence = self.fences[i]
            if fence is None and not self.lines[i].text.strip():
                close()
                continue
            if block and self.fences[block[-1]] != fence:
                close()  # a code fence neither joins nor is joined by the text around it
            block.append(i)
        close()
        return found

    def paragraphs(self, parent: int, first: int, last: int) -> None:
        for start, end, code in self.blocks(first, last):
            self.paragraph(parent, start, end, code)

    def paragraph(self, parent: int, start: int, end: int, code: bool) -> None:
        paragraph = self.add("paragraph", start, end, parent, code=code)
        text = self.content[start:end]
        spans = [(0, len(text))] if code else [(s.start, s.end) for s in split_sentences(text)]
        for span_start, span_end in spans:
            for piece_start, piece_end in _cut(text, span_start, span_end):
                self.add("sentence", start + piece_start, start + piece_end, paragraph, code=code)

    def build(self) -> list[Node]:
        headings = self.headings()
        if not headings:
            # No headings: every blank-line block is a section holding that block as its paragraph.
            for start, end, code in self.blocks(0, len(self.lines)):
                section = self.add("section", start, end, 0)
                self.paragraph(section, start, end, code)
        else:
            self._markdown(headings)
        _link(self.nodes)
        return self.nodes

    def _markdown(self, headings: list[tuple[int, int, str]]) -> None:
        first_heading = headings[0][0]
        preamble = self.blocks(0, first_heading)
        if preamble:
            section = self.add("section", preamble[0][0], preamble[-1][1], 0)
            self.paragraphs(section, 0, first_heading)
        stack: list[tuple[int, int]] = [(0, 0)]  # (node id, heading level) of the open sections
        closings = _closing_lines(headings, len(self.lines))
        for n, (line, level, text) in enumerate(headings):
            while stack[-1][1] >= level:
                stack.pop()
            body_end = headings[n + 1][0] if n + 1 < len(headings) else len(self.lines)
            end = _rstrip_end(self.content, self.lines[closings[n] - 1].end)
            section = self.add(
                "section",
                self.lines[line].start + _indent(self.lines[line].text),
                end,
                stack[-1][0],
                label=text,
                heading_level=level,
            )
            stack.append((section, level))
            self.paragraphs(section, line + 1, body_end)


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _closing_lines(headings: list[tuple[int, int, str]], line_count: int) -> list[int]:
    """For each heading, the line of the next heading of the same or a higher level (or the end).

    One pass with a stack of open headings: searching forward from each would be quadratic.
    """
    closing = [line_count] * len(headings)
    open_headings: list[int] = []
    for n, (line, level, _) in enumerate(headings):
        while open_headings and headings[open_headings[-1]][1] >= level:
            closing[open_headings.pop()] = line
        open_headings.append(n)
    return closing


def _rstrip_end(text: str, end: int) -> int:
    """len(text[:end].rstrip()), without copying the text before `end`."""
    while end > 0 and text[end - 1].isspace():
        end -= 1
    return end


def _cut(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """A sentence as pieces of at most MAX_SENTENCE_CHARS, cut at whitespace where there is any."""
    pieces: list[tuple[int, int]] = []
    while end - start > MAX_SENTENCE_CHARS:
        cut = text.rfind(" ", start + MAX_SENTENCE_CHARS // 2, start + MAX_SENTENCE_CHARS)
        cut = cut if cut > start else start + MAX_SENTENCE_CHARS
        # Offsets found without slicing: copying the rest of a long sentence per piece is quadratic.
        pieces.append((start, _rstrip_end(text, cut)))
        start = cut
        while start < end and text[start].isspace():
            start += 1
    if end > start:
        pieces.append((start, end))
    return pieces


def _link(nodes: list[Node]) -> None:
    """Positions and sibling links from the children lists."""
    for node in nodes:
        for position, child in enumerate(node.children):
            nodes[child].position = position
            nodes[child].prev_id = node.children[position - 1] if position else None
            nodes[child].next_id = node.children[position + 1] if position + 1 < len(node.children) else None


def build_tree(content: str, title: str = "") -> list[Node]:
    """A document's nodes in pre-order: document, sections, paragraphs, sentences, with links and offsets."""
    return _Builder(content, title).build()


def subtree_end(nodes: list[Node], node_id: int) -> int:
    """One past the last node id of the node's subtree (pre-order keeps a subtree contiguous)."""
    end = node_id + 1
    while end < len(nodes) and nodes[end].level > nodes[node_id].level:
        end += 1
    return end


def ancestors(nodes: list[Node], node_id: int) -> list[Node]:
    """The node's ancestors, nearest first (its parent, ..., the document)."""
    found = []
    parent = nodes[node_id].parent_id
    while parent is not None:
        found.append(nodes[parent])
        parent = nodes[parent].parent_id
    return found


def leaf_text(title: str, headings: list[str], sentence: str) -> str:
    """What is embedded for a sentence: the title and section headings above it give a short one context."""
    context = " > ".join(part for part in (title, *headings) if part)
    return f"{context}\n{sentence}" if context else sentence


def leaf_texts(title: str, content: str, nodes: list[Node]) -> list[str]:
    """The embedding text of each leaf, in node order."""
    texts = []
    for node in nodes:
        if node.kind == "sentence":
            headings = [a.label for a in reversed(ancestors(nodes, node.node_id)) if a.kind == "section"]
            texts.append(leaf_text(title, headings, node.text(content)))
    return texts


def choose_key_sentences(nodes: list[Node], vectors: Vectors) -> None:
    """Every inner node's key sentence: the leaf nearest the normalized mean of the leaves below it."""
    leaf_ids = [n.node_id for n in nodes if n.kind == "sentence"]
    row_of = {node_id: row for row, node_id in enumerate(leaf_ids)}
    for node in nodes:
        if node.kind == "sentence":
            continue
        rows = [row_of[i] for i in range(node.node_id + 1, subtree_end(nodes, node.node_id)) if i in row_of]
        if not rows:
            continue
        centroid = vectors[rows].mean(axis=0)
        node.key_sentence_id = leaf_ids[rows[int(np.argmax(vectors[rows] @ centroid))]]


@dataclass(frozen=True, slots=True)
class PreparedTree:
    """What write() stores for one document: its nodes and the vectors of its leaves, in node order."""

    document_id: str
    nodes: list[Node]
    vectors: Vectors


@dataclass(frozen=True)
class LeafMatrix:
    """A collection's leaf vectors as one matrix, reloaded when the collection's data version moves on."""

    document_ids: list[str]
    node_ids: npt.NDArray[np.int64]
    parent_ids: npt.NDArray[np.int64]
    matrix: Vectors


_SCHEMA = """
CREATE TABLE IF NOT EXISTS node_tree_documents (
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    nodes         INTEGER NOT NULL,
    leaves        INTEGER NOT NULL,
    depth         INTEGER NOT NULL,
    PRIMARY KEY (collection_id, document_id)
);
CREATE TABLE IF NOT EXISTS node_tree_nodes (
    collection_id   TEXT NOT NULL,
    document_id     TEXT NOT NULL,
    node_id         INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    level           INTEGER NOT NULL,
    heading_level   INTEGER NOT NULL,
    label           TEXT NOT NULL,
    parent_id       INTEGER,
    children        TEXT NOT NULL,
    prev_id         INTEGER,
    next_id         INTEGER,
    position        INTEGER NOT NULL,
    start_char      INTEGER NOT NULL,
    end_char        INTEGER NOT NULL,
    key_sentence_id INTEGER,
    code            INTEGER NOT NULL,
    embedding       BLOB,
    PRIMARY KEY (collection_id, document_id, node_id)
);
"""


class NodeTreeIndex:
    """The TechniqueIndex of rag_noderag: node rows and leaf vectors next to the documents."""

    name = "node_tree"

    def __init__(self, embedder: Embedder, store: DocumentStore | None, model_name: str) -> None:
        self.embedder = embedder
        self.store = store
        self.model_name = model_name
        self._matrices: VersionedCache[LeafMatrix] = VersionedCache()

    # The TechniqueIndex protocol
    def create_tables(self) -> None:
        """Create the node tables if absent."""
        connection = sqlite_connection(self.store)
        connection.executescript(_SCHEMA)

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> list[PreparedTree]:
        """Build every document's tree and embed its leaves in batches (outside the transaction)."""
        trees = [build_tree(d.content, d.title) for d in documents]
        texts = [leaf_texts(d.title, d.content, nodes) for d, nodes in zip(documents, trees, strict=True)]
        vectors = self.embed([t for doc_texts in texts for t in doc_texts])
        prepared = []
        row = 0
        for document, nodes, doc_texts in zip(documents, trees, texts, strict=True):
            doc_vectors = vectors[row : row + len(doc_texts)]
            row += len(doc_texts)
            choose_key_sentences(nodes, doc_vectors)
            prepared.append(PreparedTree(document.id, nodes, doc_vectors))
        return prepared

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Insert the prepared nodes (inside the ingest transaction, after the documents' chunks)."""
        connection = sqlite_connection(self.store)
        for tree in prepared:
            rows = []
            leaf = 0
            for node in tree.nodes:
                vector = None
                if node.kind == "sentence":
                    vector = np.ascontiguousarray(tree.vectors[leaf], dtype=np.float32).tobytes()
                    leaf += 1
                rows.append(
                    (
                        collection_id,
                        tree.document_id,
                        node.node_id,
                        node.kind,
                        node.level,
                        node.heading_level,
                        node.label,
                        node.parent_id,
                        orjson.dumps(node.children).decode(),
                        node.prev_id,
                        node.next_id,
                        node.position,
                        node.start,
                        node.end,
                        node.key_sentence_id,
                        int(node.code),
                        vector,
                    )
                )
            connection.executemany(f"INSERT INTO node_tree_nodes VALUES ({','.join('?' * 17)})", rows)
            connection.execute(
                "INSERT INTO node_tree_documents VALUES (?, ?, ?, ?, ?)",
                (collection_id, tree.document_id, len(tree.nodes), leaf, max(n.level for n in tree.nodes)),
            )

    def delete(self, collection_id: str, document_id: str) -> None:
        """Remove a document's nodes (inside the replace or delete transaction)."""
        connection = sqlite_connection(self.store)
        for table in ("node_tree_nodes", "node_tree_documents"):
            connection.execute(
                f"DELETE FROM {table} WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )

    def stats(self) -> dict[str, Any]:
        """Document, node and leaf counts, and the leaf matrices loaded in memory."""
        connection = sqlite_connection(self.store)
        row = connection.execute(
            "SELECT COUNT(*), COALESCE(SUM(nodes), 0), COALESCE(SUM(leaves), 0) FROM node_tree_documents"
        ).fetchone()
        matrices = self._matrices.snapshot()  # never waits for a matrix being loaded
        loaded = {cid: len(m.document_ids) for cid, m in matrices.items()}
        memory = sum(m.matrix.nbytes for m in matrices.values())
        return {
            "documents": row[0],
            "nodes": row[1],
            "leaves": row[2],
            "leaf_matrices_loaded": loaded,
            "leaf_memory_bytes": memory,
        }

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents have their node tree."""
        connection = sqlite_connection(self.store)
        row = connection.execute(
            "SELECT COUNT(*) FROM node_tree_documents WHERE collection_id = ?", (collection_id,)
        ).fetchone()
        return int(row[0])

    # Embedding
    def embed(self, texts: list[str]) -> Vectors:
        """Vectors for leaf texts, in batches; the store's embedding cache spares a reindex the work."""
        hashes = [hashlib.sha256(text.encode("utf-8")).digest()[:16] for text in texts]
        cached = self.store.cached_embeddings(self.model_name, list(set(hashes))) if self.store else {}
        missing = list({h: t for h, t in zip(hashes, texts, strict=True) if h not in cached}.items())
        for start in range(0, len(missing), ENCODE_BATCH):
            batch = missing[start : start + ENCODE_BATCH]
            fresh = self.embedder.encode([text for _, text in batch], bulk=True)
            items = [(h, fresh[i]) for i, (h, _) in enumerate(batch)]
            if self.store is not None:
                self.store.cache_embeddings(self.model_name, items)
            cached.update(items)
        if not hashes:
            return np.zeros((0, self.embedder.dimension), dtype=np.float32)
        return np.stack([cached[h] for h in hashes]).astype(np.float32, copy=False)

    # Reading
    def leaf_matrix(self, connection: sqlite3.Connection, collection_id: str, version: int) -> LeafMatrix:
        """The collection's leaf vectors, loaded once per data version (read before this call)."""

        def load() -> LeafMatrix:
            rows = connection.execute(
                "SELECT document_id, node_id, parent_id, embedding FROM node_tree_nodes "
                "WHERE collection_id = ? AND embedding IS NOT NULL ORDER BY rowid",
                (collection_id,),
            ).fetchall()
            vectors = (
                np.frombuffer(b"".join(row[3] for row in rows), dtype=np.float32).reshape(len(rows), -1)
                if rows
                else np.zeros((0, 0), dtype=np.float32)
            )
            return LeafMatrix(
                [row[0] for row in rows],
                np.fromiter((row[1] for row in rows), dtype=np.int64, count=len(rows)),
                np.fromiter((row[2] for row in rows), dtype=np.int64, count=len(rows)),
                vectors,
            )

        return self._matrices.get(collection_id, version, load)

    def document_trees(
        self, connection: sqlite3.Connection, collection_id: str, document_ids: list[str]
    ) -> dict[str, tuple[list[Node], Vectors]]:
        """The stored trees (nodes in pre-order, leaf vectors in node order) of the given documents."""
        trees: dict[str, tuple[list[Node], list[bytes]]] = {}
        unique = list(dict.fromkeys(document_ids))
        for start in range(0, len(unique), 500):
            batch = unique[start : start + 500]
            rows = connection.execute(
                f"""SELECT * FROM node_tree_nodes WHERE collection_id = ?
                    AND document_id IN ({",".join("?" * len(batch))}) ORDER BY document_id, node_id""",
                (collection_id, *batch),
            ).fetchall()
            for row in rows:
                nodes, blobs = trees.setdefault(row[1], ([], []))
                nodes.append(_node(row))
                if row[16] is not None:
                    blobs.append(row[16])
        return {
            doc: (nodes, np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1))
            for doc, (nodes, blobs) in trees.items()
        }


def _node(row: sqlite3.Row | tuple[Any, ...]) -> Node:
    return Node(
        node_id=row[2],
        kind=row[3],
        level=row[4],
        heading_level=row[5],
        label=row[6],
        parent_id=row[7],
        children=orjson.loads(row[8]),
        prev_id=row[9],
        next_id=row[10],
        position=row[11],
        start=row[12],
        end=row[13],
        key_sentence_id=row[14],
        code=bool(row[15]),
    )
