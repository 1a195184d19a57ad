"""NodeTreeStorage on PostgreSQL: one row per tree node (leaves carry their vector as float32 bytes).

The tables come from schema migration 5; writes go through the thread's connection, so inside an ingest
they join its transaction.
"""

from __future__ import annotations

import numpy as np

from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.techniques.noderag.storage import (
    NODE_COLUMNS,
    DocumentTree,
    LeafMatrix,
    Node,
    NodeTreeTotals,
    node_from_row,
    node_rows,
    tree_from_rows,
)

_COLUMNS = ", ".join(NODE_COLUMNS)


class PostgresNodeTreeStorage:
    """The node_tree_documents and node_tree_nodes tables."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def write_trees(self, collection_id: str, trees: list[DocumentTree]) -> None:
        """Insert the trees' node rows and one summary row per document."""
        connection = self.store.connection()
        insert = (
            f"INSERT INTO node_tree_nodes (collection_id, document_id, {_COLUMNS}) "
            f"VALUES ({', '.join(['%s'] * (len(NODE_COLUMNS) + 2))})"
        )
        for tree in trees:
            rows = [(collection_id, tree.document_id, *row) for row in node_rows(tree)]
            with connection.cursor() as cursor:
                cursor.executemany(insert, rows)
            leaves = sum(1 for row in rows if row[-1] is not None)
            connection.execute(
                "INSERT INTO node_tree_documents VALUES (%s, %s, %s, %s, %s)",
                (collection_id, tree.document_id, len(tree.nodes), leaves, max(n.level for n in tree.nodes)),
            )

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Delete the document's node rows and its summary row."""
        connection = self.store.connection()
        for table in ("node_tree_nodes", "node_tree_documents"):
            connection.execute(
                f"DELETE FROM {table} WHERE collection_id = %s AND document_id = %s",
                (collection_id, document_id),
            )

    def leaves(self, collection_id: str, document_ids: set[str] | None = None) -> LeafMatrix:
        """The leaf rows in insertion order, their vectors joined into one matrix."""
        chosen = "" if document_ids is None else " AND document_id = ANY(%s)"
        rows = (
            self.store.connection()
            .execute(
                "SELECT document_id, node_id, parent_id, embedding FROM node_tree_nodes "
                f"WHERE collection_id = %s AND embedding IS NOT NULL{chosen} ORDER BY row_id",
                (collection_id,) if document_ids is None else (collection_id, sorted(document_ids)),
            )
            .fetchall()
        )
        vectors = (
            np.frombuffer(b"".join(row["embedding"] for row in rows), dtype=np.float32).reshape(len(rows), -1)
            if rows
            else np.zeros((0, 0), dtype=np.float32)
        )
        return LeafMatrix(
            [row["document_id"] for row in rows],
            np.fromiter((row["node_id"] for row in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((row["parent_id"] for row in rows), dtype=np.int64, count=len(rows)),
            vectors,
        )

    def document_trees(self, collection_id: str, document_ids: list[str]) -> dict[str, DocumentTree]:
        """The documents' node rows in node order, in one query."""
        rows = (
            self.store.connection()
            .execute(
                f"SELECT document_id, {_COLUMNS} FROM node_tree_nodes "
                "WHERE collection_id = %s AND document_id = ANY(%s) ORDER BY document_id, node_id",
                (collection_id, list(dict.fromkeys(document_ids))),
            )
            .fetchall()
        )
        found: dict[str, tuple[list[Node], list[bytes]]] = {}
        for row in rows:
            values = tuple(row[column] for column in NODE_COLUMNS)
            nodes, blobs = found.setdefault(row["document_id"], ([], []))
            nodes.append(node_from_row(values, list(row["children"])))
            if row["embedding"] is not None:
                blobs.append(bytes(row["embedding"]))
        return {doc: tree_from_rows(doc, nodes, blobs) for doc, (nodes, blobs) in found.items()}

    def indexed_documents(self, collection_id: str) -> int:
        """The collection's summary rows."""
        row = (
            self.store.connection()
            .execute(
                "SELECT COUNT(*) AS n FROM node_tree_documents WHERE collection_id = %s", (collection_id,)
            )
            .fetchone()
        )
        return int(row["n"]) if row else 0

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's summary rows."""
        rows = (
            self.store.connection()
            .execute("SELECT document_id FROM node_tree_documents WHERE collection_id = %s", (collection_id,))
            .fetchall()
        )
        return {row["document_id"] for row in rows}

    def totals(self) -> NodeTreeTotals:
        """Sums over the summary rows."""
        row = (
            self.store.connection()
            .execute(
                "SELECT COUNT(*) AS documents, COALESCE(SUM(nodes), 0) AS nodes, "
                "COALESCE(SUM(leaves), 0) AS leaves FROM node_tree_documents"
            )
            .fetchone()
        )
        assert row is not None
        return NodeTreeTotals(int(row["documents"]), int(row["nodes"]), int(row["leaves"]))
