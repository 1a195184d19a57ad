"""TokenVectorStorage on IRIS: a row per chunk (word-piece ids and int8 codes as VARBINARY), and frequencies.

The tables come from schema step 2 (schema.py); writes go through the thread's connection, so inside an
ingest they join its transaction. Shaped like the PostgreSQL implementation; IRIS has no ON CONFLICT, so a
frequency update reads which word pieces exist, then updates those and inserts the rest.
"""

from __future__ import annotations

from iris_rag.backends.iris.schema import SCHEMA
from iris_rag.backends.iris.store import BATCH, IrisStore, _marks
from iris_rag.techniques.colbert.storage import TokenRow, TokenTotals


class IrisTokenVectors:
    """The IrisRag.ColbertTokens and IrisRag.ColbertFrequencies tables."""

    def __init__(self, store: IrisStore) -> None:
        self._store = store

    def insert(self, collection_id: str, rows: list[TokenRow]) -> None:
        """Add the chunks' rows."""
        self._store.executemany(
            f"""INSERT INTO {SCHEMA}.ColbertTokens (collection_id, chunk_id, document_id, token_count,
                   dimension, scale, token_ids, codes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
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
        rows = self._store.rows(
            f"SELECT token_ids FROM {SCHEMA}.ColbertTokens WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        )
        return [bytes(row[0]) for row in rows]

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Remove a document's rows."""
        self._store.execute(
            f"DELETE FROM {SCHEMA}.ColbertTokens WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        )

    def add_frequencies(self, collection_id: str, deltas: dict[int, int]) -> None:
        """Add each delta to its word piece's chunk count; counts that reach zero go."""
        tokens = [int(t) for t in deltas]
        present: set[int] = set()
        for start in range(0, len(tokens), BATCH):
            batch = tokens[start : start + BATCH]
            present.update(
                int(row[0])
                for row in self._store.rows(
                    f"SELECT token_id FROM {SCHEMA}.ColbertFrequencies "
                    f"WHERE collection_id = ? AND token_id IN ({_marks(len(batch))})",
                    (collection_id, *batch),
                )
            )
        self._store.executemany(
            f"UPDATE {SCHEMA}.ColbertFrequencies SET chunks = chunks + ? "
            "WHERE collection_id = ? AND token_id = ?",
            [(n, collection_id, t) for t, n in deltas.items() if t in present],
        )
        self._store.executemany(
            f"INSERT INTO {SCHEMA}.ColbertFrequencies (collection_id, token_id, chunks) VALUES (?, ?, ?)",
            [(collection_id, t, n) for t, n in deltas.items() if t not in present],
        )
        if any(n < 0 for n in deltas.values()):
            self._store.execute(
                f"DELETE FROM {SCHEMA}.ColbertFrequencies WHERE collection_id = ? AND chunks <= 0",
                (collection_id,),
            )

    def load(self, collection_id: str, chunk_ids: list[str]) -> list[TokenRow]:
        """The rows of the given chunks."""
        found: list[TokenRow] = []
        unique = list(dict.fromkeys(chunk_ids))
        for start in range(0, len(unique), BATCH):
            batch = unique[start : start + BATCH]
            found += [
                TokenRow(r[0], r[1], int(r[2]), int(r[3]), float(r[4]), bytes(r[5]), bytes(r[6]))
                for r in self._store.rows(
                    f"""SELECT chunk_id, document_id, token_count, dimension, scale, token_ids, codes
                        FROM {SCHEMA}.ColbertTokens
                        WHERE collection_id = ? AND chunk_id IN ({_marks(len(batch))})""",
                    (collection_id, *batch),
                )
            ]
        return found

    def frequencies(self, collection_id: str) -> tuple[int, dict[int, int]]:
        """How many chunks have rows, and in how many of them each word piece occurs."""
        rows = self._store.rows(
            f"SELECT token_id, chunks FROM {SCHEMA}.ColbertFrequencies WHERE collection_id = ?",
            (collection_id,),
        )
        return self.indexed_chunks(collection_id), {int(r[0]): int(r[1]) for r in rows}

    def indexed_chunks(self, collection_id: str) -> int:
        """The collection's rows."""
        total = self._store.rows(
            f"SELECT COUNT(*) FROM {SCHEMA}.ColbertTokens WHERE collection_id = ?", (collection_id,)
        )
        return int(total[0][0])

    def indexed_documents(self, collection_id: str) -> int:
        """Distinct documents with rows in the collection."""
        rows = self._store.rows(
            f"SELECT COUNT(DISTINCT document_id) FROM {SCHEMA}.ColbertTokens WHERE collection_id = ?",
            (collection_id,),
        )
        return int(rows[0][0])

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents with rows."""
        rows = self._store.rows(
            f"SELECT DISTINCT document_id FROM {SCHEMA}.ColbertTokens WHERE collection_id = ?",
            (collection_id,),
        )
        return {str(row[0]) for row in rows}

    def totals(self) -> TokenTotals:
        """Rows, documents, tokens and bytes over every collection.

        Word-piece ids count 2 bytes each, as they are stored for a vocabulary under 65,536.
        """
        # %EXACT: the pairs counted as written, whatever collation the concatenation takes.
        row = self._store.rows(
            f"""SELECT COUNT(*), COUNT(DISTINCT %EXACT(collection_id || '/' || document_id)),
                       SUM(token_count), SUM(token_count * dimension + token_count * 2 + 8)
                FROM {SCHEMA}.ColbertTokens"""
        )[0]
        return TokenTotals(int(row[0]), int(row[1]), int(row[2] or 0), int(row[3] or 0))
