"""Test double: the real worker with one extra technique index whose write signals, then blocks forever.

`python -m tests.worker.crash_worker` runs `iris_rag.worker.server.main()` unchanged, except that the
ingestor also carries BlockingIndex, registered last: by the time its write() runs, the ingest transaction
already holds the documents, chunks, keyword rows and every real technique index's rows. A test kills the
process (SIGKILL) as soon as the signal file appears, so the kill lands inside the write transaction.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import orjson

from iris_rag import service
from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.encoder import TextEncoder
from iris_rag.ingestion.background import IndexBuilder
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentInput, DocumentStore
from iris_rag.stores.technique_index import TechniqueIndex
from iris_rag.worker.server import main

SIGNAL_FILE_ENV = "CRASH_TEST_SIGNAL_FILE"
BLOCKING_PREFIX = "crash-"  # only an ingest holding a document with such an id blocks
TABLE = "crash_test_rows"


class BlockingIndex:
    """A technique index (test double) that stores one row per document and blocks on 'crash-' documents."""

    name = "crash_test_block"

    def __init__(self, signal_file: Path, store: DocumentStore) -> None:
        self.signal_file = signal_file
        self.store = store

    def create_tables(self) -> None:
        """One row per indexed document."""
        connection = sqlite_connection(self.store)
        connection.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (collection_id TEXT, document_id TEXT)")

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> Any:
        """Nothing to compute."""
        return None

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Write this index's rows; for a 'crash-' batch, report what the transaction holds and block."""
        connection = sqlite_connection(self.store)
        connection.executemany(
            f"INSERT INTO {TABLE} VALUES (?, ?)", [(collection_id, d.id) for d in documents]
        )
        if not any(d.id.startswith(BLOCKING_PREFIX) for d in documents):
            return
        # Counted inside the open transaction: proof that rows were written before the kill.
        seen = {
            "documents": connection.execute(
                "SELECT count(*) FROM documents WHERE collection_id = ? AND id LIKE 'crash-%'",
                (collection_id,),
            ).fetchone()[0],
            "chunks": connection.execute(
                "SELECT count(*) FROM chunks WHERE collection_id = ? AND document_id LIKE 'crash-%'",
                (collection_id,),
            ).fetchone()[0],
            "index_rows": connection.execute(
                f"SELECT count(*) FROM {TABLE} WHERE collection_id = ? AND document_id LIKE 'crash-%'",
                (collection_id,),
            ).fetchone()[0],
            "in_transaction": connection.in_transaction,
        }
        # Written whole then renamed, so the test never reads half a file.
        partial = self.signal_file.with_suffix(".partial")
        partial.write_bytes(orjson.dumps(seen))
        partial.replace(self.signal_file)
        threading.Event().wait()  # until SIGKILL

    def delete(self, collection_id: str, document_id: str) -> None:
        """Remove a document's row."""
        connection = sqlite_connection(self.store)
        connection.execute(
            f"DELETE FROM {TABLE} WHERE collection_id = ? AND document_id = ?", (collection_id, document_id)
        )

    def stats(self) -> dict[str, Any]:
        """Row count."""
        connection = sqlite_connection(self.store)
        return {"rows": connection.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]}

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents have a row."""
        connection = sqlite_connection(self.store)
        row = connection.execute(f"SELECT count(*) FROM {TABLE} WHERE collection_id = ?", (collection_id,))
        return int(row.fetchone()[0])


class IngestorWithBlockingIndex(Ingestor):
    """The real Ingestor, with BlockingIndex registered after every real technique index."""

    def __init__(
        self,
        settings: Settings,
        store: DocumentStore,
        embedder: TextEncoder,
        technique_indexes: list[TechniqueIndex] | None = None,
        builder: IndexBuilder | None = None,
    ) -> None:
        blocking = BlockingIndex(Path(os.environ[SIGNAL_FILE_ENV]), store)
        store.register_index(blocking)
        super().__init__(settings, store, embedder, [*(technique_indexes or []), blocking], builder)


if __name__ == "__main__":
    # RagService (the composition root) builds its ingestor from this name.
    service.Ingestor = IngestorWithBlockingIndex  # type: ignore[attr-defined]
    main()
