"""TokenVectorStorage on SQLite: one WITHOUT ROWID row per chunk (ids and codes as BLOBs), and frequencies."""

from __future__ import annotations

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.techniques.colbert.storage import TokenRow, TokenTotals

TABLE = "colbert_token_vectors"
DF_TABLE = "colbert_token_df"

_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        collection_id TEXT NOT NULL,
        chunk_id      TEXT NOT NULL,
        document_id   TEXT NOT NULL,
        token_count   INTEGER NOT NULL,
        dimension     INTEGER NOT NULL,
        scale         REAL NOT NULL,
        token_ids     BLOB NOT NULL,
        vectors       BLOB NOT NULL,
        PRIMARY KEY (collection_id, chunk_id)
    ) WITHOUT ROWID""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_by_document ON {TABLE}(collection_id, document_id)",
    f"""CREATE TABLE IF NOT EXISTS {DF_TABLE} (
        collection_id TEXT NOT NULL,
        token_id      INTEGER NOT NULL,
        chunks        INTEGER NOT NULL,
        PRIMARY KEY (collection_id, token_id)
    ) WITHOUT ROWID""",
)


class SqliteTokenVectors:
    """The token store in the store's SQLite file; the tables are made with the storage."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        with store.write_transaction() as connection:
            for statement in _SCHEMA:
                connection.execute(statement)

    def insert(self, collection_id: str, rows: list[TokenRow]) -> None:
        """Add the chunks' rows."""
        self._store.connection().executemany(
            f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
                f"SELECT token_ids FROM {TABLE} WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )
            .fetchall()
        )
        return [bytes(row[0]) for row in rows]

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Remove a document's rows."""
        self._store.connection().execute(
            f"DELETE FROM {TABLE} WHERE collection_id = ? AND document_id = ?", (collection_id, document_id)
        )

    def add_frequencies(self, collection_id: str, deltas: dict[int, int]) -> None:
        """Add each delta to its word piece's chunk count; counts that reach zero go."""
        connection = self._store.connection()
        connection.executemany(
            f"""INSERT INTO {DF_TABLE} VALUES (?, ?, ?)
                ON CONFLICT (collection_id, token_id) DO UPDATE SET chunks = chunks + excluded.chunks""",
            [(collection_id, token, n) for token, n in deltas.items()],
        )
        if any(n < 0 for n in deltas.values()):
            connection.execute(
                f"DELETE FROM {DF_TABLE} WHERE collection_id = ? AND chunks <= 0", (collection_id,)
            )

    def load(self, collection_id: str, chunk_ids: list[str]) -> list[TokenRow]:
        """The rows of the given chunks, 500 ids per statement."""
        found: list[TokenRow] = []
        connection = self._store.connection()
        for start in range(0, len(chunk_ids), 500):
            batch = chunk_ids[start : start + 500]
            rows = connection.execute(
                f"""SELECT chunk_id, document_id, token_count, dimension, scale, token_ids, vectors
                    FROM {TABLE} WHERE collection_id = ? AND chunk_id IN ({",".join("?" * len(batch))})""",
                (collection_id, *batch),
            ).fetchall()
            found.extend(
                TokenRow(
                    row[0], row[1], int(row[2]), int(row[3]), float(row[4]), bytes(row[5]), bytes(row[6])
                )
                for row in rows
            )
        return found

    def frequencies(self, collection_id: str) -> tuple[int, dict[int, int]]:
        """How many chunks have rows, and in how many of them each word piece occurs."""
        rows = (
            self._store.connection()
            .execute(f"SELECT token_id, chunks FROM {DF_TABLE} WHERE collection_id = ?", (collection_id,))
            .fetchall()
        )
        return self.indexed_chunks(collection_id), {int(t): int(n) for t, n in rows}

    def indexed_chunks(self, collection_id: str) -> int:
        """The collection's rows, counted in the document index."""
        row = (
            self._store.connection()
            .execute(f"SELECT COUNT(*) FROM {TABLE} WHERE collection_id = ?", (collection_id,))
            .fetchone()
        )
        return int(row[0])

    def indexed_documents(self, collection_id: str) -> int:
        """Distinct documents with rows in the collection."""
        row = (
            self._store.connection()
            .execute(
                f"SELECT COUNT(DISTINCT document_id) FROM {TABLE} WHERE collection_id = ?", (collection_id,)
            )
            .fetchone()
        )
        return int(row[0])

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents with rows."""
        rows = (
            self._store.connection()
            .execute(f"SELECT DISTINCT document_id FROM {TABLE} WHERE collection_id = ?", (collection_id,))
            .fetchall()
        )
        return {row[0] for row in rows}

    def totals(self) -> TokenTotals:
        """Rows, documents, tokens and bytes over every collection."""
        row = (
            self._store.connection()
            .execute(
                f"""SELECT COUNT(*), COUNT(DISTINCT collection_id || char(0) || document_id),
                           COALESCE(SUM(token_count), 0),
                           COALESCE(SUM(length(vectors) + length(token_ids) + 8), 0)
                    FROM {TABLE}"""
            )
            .fetchone()
        )
        return TokenTotals(*(int(v) for v in row))
