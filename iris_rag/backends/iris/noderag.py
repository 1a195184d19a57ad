"""NodeTreeStorage on IRIS: one row per tree node (leaves carry their vector as float32 bytes).

The tables come from schema step 3 (schema.py), with NODE_COLUMNS in their order under IRIS-safe names;
writes go through the thread's connection, so inside an ingest they join its transaction. Shaped like the
PostgreSQL implementation: `children` is JSON text here, `code` an integer, and write_order keeps the
order the leaves were written in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from iris_rag.backends.iris.schema import SCHEMA
from iris_rag.backends.iris.store import BATCH, IrisStore, _marks
from iris_rag.techniques.noderag.storage import (
    DocumentTree,
    LeafMatrix,
    Node,
    NodeTreeTotals,
    node_from_row,
    node_rows,
    tree_from_rows,
)

# NODE_COLUMNS, in that order, as named in IrisRag.NodeTreeNodes.
_COLUMNS = (
    "node_id, node_kind, node_level, heading_level, node_label, parent_id, children_json, prev_id, next_id, "
    "node_position, start_char, end_char, key_sentence_id, is_code, raw_vector"
)


# A collection's leaves with the order they were written in (a row per leaf).
_LEAF_SELECT = f"""SELECT write_order, document_id, node_id, parent_id, raw_vector
    FROM {SCHEMA}.NodeTreeNodes WHERE collection_id = ? AND raw_vector IS NOT NULL"""


class IrisNodeTreeStorage:
    """The IrisRag.NodeTreeDocuments and IrisRag.NodeTreeNodes tables."""

    def __init__(self, store: IrisStore) -> None:
        self.store = store

    def write_trees(self, collection_id: str, trees: list[DocumentTree]) -> None:
        """Insert the trees' node rows and one summary row per document."""
        last = self.store.rows(
            f"SELECT MAX(write_order) FROM {SCHEMA}.NodeTreeNodes WHERE collection_id = ?", (collection_id,)
        )[0][0]
        order = int(last or 0)
        for tree in trees:
            rows: list[tuple[Any, ...]] = []
            for row in node_rows(tree):
                order += 1
                values = list(row)
                values[6] = orjson.dumps(list(values[6])).decode()  # children
                values[13] = int(bool(values[13]))  # code
                rows.append((collection_id, tree.document_id, order, *values))
            self.store.executemany(
                f"INSERT INTO {SCHEMA}.NodeTreeNodes (collection_id, document_id, write_order, {_COLUMNS}) "
                f"VALUES ({_marks(len(rows[0]))})",
                rows,
            )
            self.store.execute(
                f"""INSERT INTO {SCHEMA}.NodeTreeDocuments (collection_id, document_id, node_total,
                       leaf_total, tree_depth) VALUES (?, ?, ?, ?, ?)""",
                (
                    collection_id,
                    tree.document_id,
                    len(tree.nodes),
                    sum(1 for row in rows if row[-1] is not None),
                    max(n.level for n in tree.nodes),
                ),
            )

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Delete the document's node rows and its summary row."""
        for table in (f"{SCHEMA}.NodeTreeNodes", f"{SCHEMA}.NodeTreeDocuments"):
            self.store.execute(
                f"DELETE FROM {table} WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )

    def leaves(self, collection_id: str, document_ids: set[str] | None = None) -> LeafMatrix:
        """The leaf rows in the order written, their vectors joined into one matrix."""
        if document_ids is None:
            rows = list(self.store.rows(f"{_LEAF_SELECT} ORDER BY write_order", (collection_id,)))
        else:
            ordered = sorted(document_ids)
            rows = []
            for start in range(0, len(ordered), BATCH):
                batch = ordered[start : start + BATCH]
                rows += self.store.rows(
                    f"{_LEAF_SELECT} AND document_id IN ({_marks(len(batch))})", (collection_id, *batch)
                )
            rows.sort(key=lambda row: int(row[0]))
        vectors = (
            np.frombuffer(b"".join(bytes(row[4]) for row in rows), dtype=np.float32).reshape(len(rows), -1)
            if rows
            else np.zeros((0, 0), dtype=np.float32)
        )
        return LeafMatrix(
            [row[1] for row in rows],
            np.fromiter((int(row[2]) for row in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((int(row[3]) for row in rows), dtype=np.int64, count=len(rows)),
            vectors,
        )

    def document_trees(self, collection_id: str, document_ids: list[str]) -> dict[str, DocumentTree]:
        """The documents' node rows in node order."""
        found: dict[str, tuple[list[Node], list[bytes]]] = {}
        unique = list(dict.fromkeys(document_ids))
        for start in range(0, len(unique), BATCH):
            batch = unique[start : start + BATCH]
            for row in self.store.rows(
                f"""SELECT document_id, {_COLUMNS} FROM {SCHEMA}.NodeTreeNodes
                    WHERE collection_id = ? AND document_id IN ({_marks(len(batch))})
                    ORDER BY document_id, node_id""",
                (collection_id, *batch),
            ):
                values = row[1:]
                nodes, blobs = found.setdefault(row[0], ([], []))
                nodes.append(node_from_row(values, [int(c) for c in orjson.loads(values[6])]))
                if values[14] is not None:
                    blobs.append(bytes(values[14]))
        return {doc: tree_from_rows(doc, nodes, blobs) for doc, (nodes, blobs) in found.items()}

    def indexed_documents(self, collection_id: str) -> int:
        """The collection's summary rows."""
        rows = self.store.rows(
            f"SELECT COUNT(*) FROM {SCHEMA}.NodeTreeDocuments WHERE collection_id = ?", (collection_id,)
        )
        return int(rows[0][0])

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's summary rows."""
        rows = self.store.rows(
            f"SELECT document_id FROM {SCHEMA}.NodeTreeDocuments WHERE collection_id = ?", (collection_id,)
        )
        return {str(row[0]) for row in rows}

    def totals(self) -> NodeTreeTotals:
        """Sums over the summary rows."""
        row = self.store.rows(
            f"SELECT COUNT(*), SUM(node_total), SUM(leaf_total) FROM {SCHEMA}.NodeTreeDocuments"
        )[0]
        return NodeTreeTotals(int(row[0]), int(row[1] or 0), int(row[2] or 0))
