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

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.encoder import TextEncoder
from iris_rag.stores.base import CacheItem, CacheOwner, ChunkInput, DocumentInput, DocumentStore, cache_key
from iris_rag.stores.technique_index import ChunkEncoding
from iris_rag.stores.versioned import VersionedCache, update_limit
from iris_rag.techniques.noderag.storage import (
    DocumentTree,
    LeafMatrix,
    Node,
    NodeKind,
    NodeTreeStorage,
    Vectors,
)
from iris_rag.text import embedding_text, split_sentences

# A sentence longer than this is cut at whitespace: the encoder reads at most 256 word pieces anyway.
MAX_SENTENCE_CHARS = 1000
# Leaves are embedded this many texts per encode call (outside the ingest transaction): the encoder sorts a
# call's texts by length, so larger calls pad less; each call's vectors go to the embedding cache.
ENCODE_BATCH = 1024
LEAF_TEXT = (
    "document title > section headings, newline, sentence; with NODERAG_LEAF_VECTORS=pooled and rag_colbert "
    "served: the chunk's forward pass (title + chunk) mean-pooled over the sentence, where a chunk holds it"
)
"""What a leaf's vector is made from (NodeRAG's metadata.technique_specific.leaf_text)."""

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


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


def leaf_chunks(nodes: list[Node], chunks: list[tuple[int, int]]) -> list[tuple[int, int] | None]:
    """For each leaf, in node order: (chunk, row) of its span in the first chunk holding it whole, or None.

    `row` counts the leaves given to that chunk before it: the leaf's row in the chunk's pooled vectors.
    """
    found: list[tuple[int, int] | None] = []
    rows = [0] * len(chunks)
    first = 0  # chunks and leaves both run forward through the document
    for node in nodes:
        if node.kind != "sentence":
            continue
        while first < len(chunks) and chunks[first][1] <= node.start:
            first += 1
        place = None
        for chunk in range(first, len(chunks)):
            start, end = chunks[chunk]
            if start > node.start:
                break
            if node.end <= end:
                place = (chunk, rows[chunk])
                rows[chunk] += 1
                break
        found.append(place)
    return found


def pooling_spans(
    title: str, nodes: list[Node], chunks: list[tuple[int, int]]
) -> list[list[tuple[int, int]]]:
    """Per chunk, the spans of its embedding text (title + chunk) that its leaves cover (see leaf_chunks)."""
    prefix = len(embedding_text(title, ""))  # the chunk's text starts after the title and its newline
    spans: list[list[tuple[int, int]]] = [[] for _ in chunks]
    leaves = [n for n in nodes if n.kind == "sentence"]
    for node, place in zip(leaves, leaf_chunks(nodes, chunks), strict=True):
        if place is not None:
            start = chunks[place[0]][0]
            spans[place[0]].append((prefix + node.start - start, prefix + node.end - start))
    return spans


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


class NodeTreeIndex:
    """The TechniqueIndex of rag_noderag: node rows and leaf vectors next to the documents."""

    name = "node_tree"

    def __init__(self, embedder: TextEncoder, store: DocumentStore, model_name: str) -> None:
        self.embedder = embedder
        self.store = store
        self.model_name = model_name
        # Obtained now, outside any transaction: making it creates the backend's tables. (mypy refuses a
        # Protocol for type[T], python/mypy#4717, though only its implementation is ever made.)
        self.storage = store.technique_storage(NodeTreeStorage)
        self._matrices: VersionedCache[LeafMatrix] = VersionedCache()

    # The SpanPooling protocol
    def pooling_spans(
        self, title: str, content: str, chunks: list[tuple[int, int]]
    ) -> list[list[tuple[int, int]]]:
        """Per chunk, its leaves' (sentences') spans in its embedding text, to pool in the ingest's pass."""
        return pooling_spans(title, build_tree(content, title), chunks)

    # The TechniqueIndex protocol
    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> list[DocumentTree]:
        """Build every document's tree and give each leaf its vector (outside the transaction).

        A leaf's vector is its chunk's hidden states pooled over the sentence, from the ingest's one
        forward pass (SpanPooling), where that pass gave it; every other leaf is embedded on its own, with
        its title and headings (leaf_text), in batches.
        """
        trees = [build_tree(d.content, d.title) for d in documents]
        pooled = [_pooled_leaves(d, nodes) for d, nodes in zip(documents, trees, strict=True)]
        texts = [leaf_texts(d.title, d.content, nodes) for d, nodes in zip(documents, trees, strict=True)]
        todo = [(d, i) for d, doc_pooled in enumerate(pooled) for i, v in enumerate(doc_pooled) if v is None]
        owners = [CacheOwner.of(collection_id, document) for document in documents]
        vectors = self.embed([texts[d][i] for d, i in todo], [owners[d] for d, _ in todo])
        for (d, i), vector in zip(todo, vectors, strict=True):
            pooled[d][i] = vector
        prepared = []
        for document, nodes, doc_pooled in zip(documents, trees, pooled, strict=True):
            doc_vectors = _stack([v for v in doc_pooled if v is not None], self.embedder.dimension)
            choose_key_sentences(nodes, doc_vectors)
            prepared.append(DocumentTree(document.id, nodes, doc_vectors))
        return prepared

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Store the prepared trees of these documents (inside the ingest transaction, after their chunks).

        The background builder passes fewer documents than it prepared when some changed meanwhile.
        """
        wanted = {d.id for d in documents}
        self.storage.write_trees(collection_id, [t for t in prepared if t.document_id in wanted])

    def delete(self, collection_id: str, document_id: str) -> None:
        """Remove a document's tree (inside the replace or delete transaction)."""
        self.storage.delete_document(collection_id, document_id)

    def stats(self) -> dict[str, Any]:
        """Document, node and leaf counts, and the leaf matrices loaded in memory."""
        totals = self.storage.totals()
        matrices = self._matrices.snapshot()  # never waits for a matrix being loaded
        loaded = {cid: len(m.document_ids) for cid, m in matrices.items()}
        memory = sum(m.matrix.nbytes for m in matrices.values())
        return {
            "documents": totals.documents,
            "nodes": totals.nodes,
            "leaves": totals.leaves,
            "leaf_matrices_loaded": loaded,
            "leaf_memory_bytes": memory,
        }

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents have their node tree."""
        return self.storage.indexed_documents(collection_id)

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents that have their node tree."""
        return self.storage.indexed_document_ids(collection_id)

    # Embedding
    def embed(self, texts: list[str], owners: list[CacheOwner]) -> Vectors:
        """Vectors for leaf texts, in batches; the store's embedding cache spares a reindex the work.

        `owners`: each text's document, which owns its cached vector (the first, for a text repeated).
        """
        hashes = [cache_key(text) for text in texts]
        cached = self.store.cached_embeddings(self.model_name, list(set(hashes)))
        missing: dict[bytes, tuple[str, CacheOwner]] = {}
        for h, text, owner in zip(hashes, texts, owners, strict=True):
            if h not in cached:
                missing.setdefault(h, (text, owner))
        work = list(missing.items())
        for start in range(0, len(work), ENCODE_BATCH):
            batch = work[start : start + ENCODE_BATCH]
            fresh = self.embedder.encode([text for _, (text, _) in batch], bulk=True)
            items: list[CacheItem] = [(h, fresh[i], owner) for i, (h, (_, owner)) in enumerate(batch)]
            self.store.cache_embeddings(self.model_name, items)
            cached.update((h, fresh[i]) for i, (h, _) in enumerate(batch))
        if not hashes:
            return np.zeros((0, self.embedder.dimension), dtype=np.float32)
        return np.stack([cached[h] for h in hashes]).astype(np.float32, copy=False)

    # Reading
    def leaf_matrix(self, collection_id: str, version: int) -> LeafMatrix:
        """The collection's leaf vectors for this data version (read before this call) or newer.

        Loaded whole once; after a write, brought up to date from the documents changed since (the store's
        change log), where the store can name them.
        """

        def update(held: int, matrix: LeafMatrix) -> LeafMatrix | None:
            documents_held = len(matrix.document_ids) // 10  # about ten leaves a document
            documents = self.store.changed_documents(
                collection_id, held, version, update_limit(documents_held)
            )
            if documents is None:
                return None
            return matrix.replaced(documents, self.storage.leaves(collection_id, documents))

        return self._matrices.get(collection_id, version, lambda: self.storage.leaves(collection_id), update)

    def document_trees(self, collection_id: str, document_ids: list[str]) -> dict[str, DocumentTree]:
        """The stored trees (nodes in pre-order, leaf vectors in node order) of the given documents."""
        return self.storage.document_trees(collection_id, document_ids)


def _pooled_leaves(document: DocumentInput, nodes: list[Node]) -> list[npt.NDArray[np.float32] | None]:
    """Each leaf's vector pooled in the ingest's pass over its chunk (ChunkInput.tokens), or None."""
    chunks: list[ChunkInput] = document.chunks
    places = leaf_chunks(nodes, [(c.start_char, c.end_char) for c in chunks])
    found: list[npt.NDArray[np.float32] | None] = []
    for place in places:
        vector = None
        if place is not None:
            encoding = chunks[place[0]].tokens
            if isinstance(encoding, ChunkEncoding) and encoding.pooled is not None:
                row = encoding.pooled[place[1]]
                vector = None if np.isnan(row).any() else row
        found.append(vector)
    return found


def _stack(rows: list[npt.NDArray[np.float32]], dimension: int) -> Vectors:
    if not rows:
        return np.zeros((0, dimension), dtype=np.float32)
    return np.stack(rows).astype(np.float32, copy=False)
