"""TokenVectorStorage on PostgreSQL: one row per chunk (word-piece ids and codes as BYTEA), and frequencies.

The tables come from schema migration 4; writes go through the thread's connection, so inside an ingest
they join its transaction.
"""

from __future__ import annotations

from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.techniques.colbert.storage import TokenRow, TokenTotals


class PostgresTokenVectors:
    """The colbert_token_vectors and colbert_token_df tables."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def insert(self, collection_id: str, rows: list[TokenRow]) -> None:
        """Add the chunks' rows."""
        with self._store.connection().cursor() as cursor:
            cursor.executemany(
                "INSERT INTO colbert_token_vectors VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    (
                        collection_id,
                        r.chunk_id,
                        r.document_id,
                        r.token_count,
                        r.dimension,
                        r.scale,
                        r.token_ids,
                        r.codes,
                    )
                    for r in rows
                ],
            )

    def document_token_ids(self, collection_id: str, document_id: str) -> list[bytes]:
        """The word-piece ids of each of a document's rows."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT token_ids FROM colbert_token_vectors WHERE collection_id = %s AND document_id = %s",
                (collection_id, document_id),
            )
            .fetchall()
        )
        return [bytes(row["token_ids"]) for row in rows]

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Remove a document's rows."""
        self._store.connection().execute(
            "DELETE FROM colbert_token_vectors WHERE collection_id = %s AND document_id = %s",
            (collection_id, document_id),
        )

    def add_frequencies(self, collection_id: str, deltas: dict[int, int]) -> None:
        """Add each delta to its word piece's chunk count; counts that reach zero go."""
        connection = self._store.connection()
        with connection.cursor() as cursor:
            cursor.executemany(
                """INSERT INTO colbert_token_df AS df VALUES (%s, %s, %s)
                   ON CONFLICT (collection_id, token_id)
                   DO UPDATE SET chunks = df.chunks + excluded.chunks""",
                [(collection_id, token, n) for token, n in deltas.items()],
            )
        if any(n < 0 for n in deltas.values()):
            connection.execute(
                "DELETE FROM colbert_token_df WHERE collection_id = %s AND chunks <= 0", (collection_id,)
            )

    def load(self, collection_id: str, chunk_ids: list[str]) -> list[TokenRow]:
        """The rows of the given chunks (one query: the ids travel as one array)."""
        rows = (
            self._store.connection()
            .execute(
                """SELECT chunk_id, document_id, token_count, dimension, scale, token_ids, vectors
                   FROM colbert_token_vectors WHERE collection_id = %s AND chunk_id = ANY(%s)""",
                (collection_id, chunk_ids),
            )
            .fetchall()
        )
        return [
            TokenRow(
                r["chunk_id"],
                r["document_id"],
                int(r["token_count"]),
                int(r["dimension"]),
                float(r["scale"]),
                bytes(r["token_ids"]),
                bytes(r["vectors"]),
            )
            for r in rows
        ]

    def frequencies(self, collection_id: str) -> tuple[int, dict[int, int]]:
        """How many chunks have rows, and in how many of them each word piece occurs."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT token_id, chunks FROM colbert_token_df WHERE collection_id = %s", (collection_id,)
            )
            .fetchall()
        )
        return self.indexed_chunks(collection_id), {int(r["token_id"]): int(r["chunks"]) for r in rows}

    def indexed_chunks(self, collection_id: str) -> int:
        """The collection's rows."""
        row = (
            self._store.connection()
            .execute(
                "SELECT COUNT(*) AS n FROM colbert_token_vectors WHERE collection_id = %s", (collection_id,)
            )
            .fetchone()
        )
        return int(row["n"]) if row else 0

    def indexed_documents(self, collection_id: str) -> int:
        """Distinct documents with rows in the collection."""
        row = (
            self._store.connection()
            .execute(
                "SELECT COUNT(DISTINCT document_id) AS n FROM colbert_token_vectors WHERE collection_id = %s",
                (collection_id,),
            )
            .fetchone()
        )
        return int(row["n"]) if row else 0

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents with rows."""
        rows = (
            self._store.connection()
            .execute(
                "SELECT DISTINCT document_id FROM colbert_token_vectors WHERE collection_id = %s",
                (collection_id,),
            )
            .fetchall()
        )
        return {row["document_id"] for row in rows}

    def totals(self) -> TokenTotals:
        """Rows, documents, tokens and bytes over every collection."""
        row = (
            self._store.connection()
            .execute(
                """SELECT COUNT(*) AS chunks, COUNT(DISTINCT (collection_id, document_id)) AS documents,
                          COALESCE(SUM(token_count), 0) AS tokens,
                          COALESCE(SUM(length(vectors) + length(token_ids) + 8), 0) AS bytes
                   FROM colbert_token_vectors"""
            )
            .fetchone()
        )
        assert row is not None
        return TokenTotals(int(row["chunks"]), int(row["documents"]), int(row["tokens"]), int(row["bytes"]))
