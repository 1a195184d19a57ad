"""NodeTreeStorage on SQLite: one row per tree node (leaves carry their vector as a float32 blob)."""

from __future__ import annotations

import sqlite3

import numpy as np
import orjson

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.techniques.noderag.storage import (
    DocumentTree,
    LeafMatrix,
    Node,
    NodeTreeTotals,
    node_from_row,
    node_rows,
    tree_from_rows,
)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS node_tree_documents (
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    nodes         INTEGER NOT NULL,
    leaves        INTEGER NOT NULL,
    depth         INTEGER NOT NULL,
    PRIMARY KEY (collection_id, document_id)
)""",
    """CREATE TABLE IF NOT EXISTS node_tree_nodes (
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
)""",
)

# Documents read per query by document_trees: SQLite caps the parameters of one statement.
_READ_BATCH = 500


class SqliteNodeTreeStorage:
    """The node_tree_documents and node_tree_nodes tables, through the store's per-thread connection."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        with store.write_transaction() as connection:  # joins one already open on this thread
            _create_tables(connection)

    def write_trees(self, collection_id: str, trees: list[DocumentTree]) -> None:
        """Insert the trees' node rows and one summary row per document."""
        connection = self.store.connection()
        for tree in trees:
            rows = [
                (
                    collection_id,
                    tree.document_id,
                    *row[:6],
                    orjson.dumps(row[6]).decode(),
                    *row[7:13],
                    int(row[13]),
                    row[14],
                )
                for row in node_rows(tree)
            ]
            connection.executemany(f"INSERT INTO node_tree_nodes VALUES ({','.join('?' * 17)})", rows)
            leaves = sum(1 for row in rows if row[16] is not None)
            connection.execute(
                "INSERT INTO node_tree_documents VALUES (?, ?, ?, ?, ?)",
                (collection_id, tree.document_id, len(tree.nodes), leaves, max(n.level for n in tree.nodes)),
            )

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Delete the document's node rows and its summary row."""
        connection = self.store.connection()
        for table in ("node_tree_nodes", "node_tree_documents"):
            connection.execute(
                f"DELETE FROM {table} WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )

    def leaves(self, collection_id: str, document_ids: set[str] | None = None) -> LeafMatrix:
        """The leaf rows in rowid (insertion) order, their blobs joined into one matrix."""
        connection = self.store.connection()
        query = (
            "SELECT rowid, document_id, node_id, parent_id, embedding FROM node_tree_nodes "
            "WHERE collection_id = ? AND embedding IS NOT NULL"
        )
        if document_ids is None:
            rows = connection.execute(f"{query} ORDER BY rowid", (collection_id,)).fetchall()
        else:
            ordered = sorted(document_ids)
            rows = []
            for start in range(0, len(ordered), _READ_BATCH):
                batch = ordered[start : start + _READ_BATCH]
                rows += connection.execute(
                    f"{query} AND document_id IN ({','.join('?' * len(batch))})", (collection_id, *batch)
                ).fetchall()
            rows.sort(key=lambda row: int(row[0]))  # rowid: the order a whole read gives
        vectors = (
            np.frombuffer(b"".join(row[4] for row in rows), dtype=np.float32).reshape(len(rows), -1)
            if rows
            else np.zeros((0, 0), dtype=np.float32)
        )
        return LeafMatrix(
            [row[1] for row in rows],
            np.fromiter((row[2] for row in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((row[3] for row in rows), dtype=np.int64, count=len(rows)),
            vectors,
        )

    def document_trees(self, collection_id: str, document_ids: list[str]) -> dict[str, DocumentTree]:
        """The documents' node rows in node order, a few hundred documents per query."""
        connection = self.store.connection()
        found: dict[str, tuple[list[Node], list[bytes]]] = {}
        unique = list(dict.fromkeys(document_ids))
        for start in range(0, len(unique), _READ_BATCH):
            batch = unique[start : start + _READ_BATCH]
            rows = connection.execute(
                f"""SELECT * FROM node_tree_nodes WHERE collection_id = ?
                    AND document_id IN ({",".join("?" * len(batch))}) ORDER BY document_id, node_id""",
                (collection_id, *batch),
            ).fetchall()
            for row in rows:
                nodes, blobs = found.setdefault(row[1], ([], []))
                nodes.append(node_from_row(row[2:], orjson.loads(row[8])))
                if row[16] is not None:
                    blobs.append(row[16])
        return {doc: tree_from_rows(doc, nodes, blobs) for doc, (nodes, blobs) in found.items()}

    def indexed_documents(self, collection_id: str) -> int:
        """The collection's summary rows."""
        row = (
            self.store.connection()
            .execute("SELECT COUNT(*) FROM node_tree_documents WHERE collection_id = ?", (collection_id,))
            .fetchone()
        )
        return int(row[0])

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's summary rows."""
        rows = (
            self.store.connection()
            .execute("SELECT document_id FROM node_tree_documents WHERE collection_id = ?", (collection_id,))
            .fetchall()
        )
        return {row[0] for row in rows}

    def totals(self) -> NodeTreeTotals:
        """Sums over the summary rows."""
        row = (
            self.store.connection()
            .execute(
                "SELECT COUNT(*), COALESCE(SUM(nodes), 0), COALESCE(SUM(leaves), 0) FROM node_tree_documents"
            )
            .fetchone()
        )
        return NodeTreeTotals(int(row[0]), int(row[1]), int(row[2]))


def _create_tables(connection: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        connection.execute(statement)
