"""`iris-rag sync`: make a collection's documents from a folder match the folder as it is now.

Files are told apart by their path relative to the folder (`source_path`) and compared by content hash
(`sha256`), both stored in each document's metadata at ingest. Only documents whose `source_root` is this
folder are looked at, so documents ingested as text or from another folder are never touched.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.ingestion.loaders import (
    CsvColumns,
    SourceDocument,
    SourceError,
    find_files,
    parse_file,
    read_regular_file,
)
from iris_rag.stores.base import DocumentStore
from iris_rag.stores.filters import Condition, MetadataFilter

BATCH = 256


@dataclass
class StoredFile:
    """What the collection holds of one file: the hash it was ingested at and its documents' ids."""

    sha256: str | None
    document_ids: list[str] = field(default_factory=list)


@dataclass
class SyncReport:
    """What a sync did (or, dry, would do), counted in files."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    errors: list[SourceError] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the terminal."""
        return (
            f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged, "
            f"{self.deleted} deleted, {len(self.errors)} errors"
        )


@dataclass
class _Pending:
    """A new or changed file's documents, waiting to be ingested."""

    relative: str
    new: bool
    documents: list[SourceDocument]
    failed: int = 0


def stored_files(store: DocumentStore, collection_id: str, root: Path) -> dict[str, StoredFile]:
    """The collection's documents read from files under root, by source path."""
    if store.get_collection(collection_id) is None:
        return {}
    metadata_filter = MetadataFilter((Condition("source_root", "eq", str(root)),))
    files: dict[str, StoredFile] = defaultdict(lambda: StoredFile(None))
    for document_id in sorted(store.matching_document_ids(collection_id, metadata_filter)):
        document = store.get_document(collection_id, document_id)
        relative = document.metadata.get("source_path") if document else None
        if document is None or not isinstance(relative, str):
            continue
        entry = files[relative]
        entry.sha256 = document.metadata.get("sha256")
        entry.document_ids.append(document_id)
    return dict(files)


def sync_folder(
    folder: Path,
    collection_id: str,
    *,
    store: DocumentStore,
    ingestor: Ingestor,
    dry_run: bool = False,
    csv_columns: CsvColumns | None = None,
) -> SyncReport:
    """Ingest new and changed files, delete the documents of files that are gone; dry: only count."""
    if not folder.is_dir():
        msg = f"{folder} is not a folder"
        raise InvalidParametersError(msg)
    root = folder.resolve()
    stored = stored_files(store, collection_id, root)
    ours = {document_id for file in stored.values() for document_id in file.document_ids}
    report = SyncReport()
    pending: list[_Pending] = []
    present: set[str] = set()
    stale: list[str] = []  # documents to delete
    for item in find_files(root):
        if isinstance(item, SourceError):
            report.errors.append(item)
            continue
        present.add(item.relative)
        data = read_regular_file(item.path)
        if isinstance(data, SourceError):
            report.errors.append(data)
            continue
        before = stored.get(item.relative)
        if before is not None and before.sha256 == hashlib.sha256(data).hexdigest():
            report.unchanged += 1
            continue
        parsed = list(parse_file(item, data, csv_columns=csv_columns))
        report.errors += [entry for entry in parsed if isinstance(entry, SourceError)]
        documents = [entry for entry in parsed if isinstance(entry, SourceDocument)]
        documents = _not_held_elsewhere(store, collection_id, root, ours, item.relative, documents, report)
        if not documents:
            continue  # unreadable now: its documents, if any, stay as they were
        pending.append(_Pending(item.relative, before is None, documents))
        if before is not None:  # records a changed .jsonl or .csv no longer has
            kept = {document.id for document in documents}
            stale += [d for d in before.document_ids if d not in kept]
    gone = sorted(set(stored) - present)
    stale += [document_id for relative in gone for document_id in stored[relative].document_ids]
    report.deleted = len(gone)
    if not dry_run:
        # An id that moved to another file (a record from one .jsonl to another) is written again here.
        written = _ingest(ingestor, collection_id, pending, report)
        with store.transaction():
            for document_id in stale:
                check_cancelled()
                if document_id not in written:
                    store.delete_document(collection_id, document_id)
    for file in pending:
        if file.failed == len(file.documents):
            continue  # every document of it refused (reported): neither added nor updated
        if file.new:
            report.added += 1
        else:
            report.updated += 1
    return report


def _not_held_elsewhere(
    store: DocumentStore,
    collection_id: str,
    root: Path,
    ours: set[str],
    relative: str,
    documents: list[SourceDocument],
    report: SyncReport,
) -> list[SourceDocument]:
    """The documents whose id no document from elsewhere holds; the others are reported and left alone.

    An id is a path relative to its folder, so two folders' `notes.txt`, or a document sent as text with
    that id, are one document: replacing it would break the promise that sync touches only this folder's.
    """
    kept = []
    for document in documents:
        held = (
            None
            if document.id is None or document.id in ours
            else store.get_document(collection_id, document.id)
        )
        if held is None:
            kept.append(document)
            continue
        owner = held.metadata.get("source_root")
        where = f"from the folder {owner}" if isinstance(owner, str) else "not read from a folder"
        message = (
            f"document id {document.id!r} is already in {collection_id!r}, {where}; left as it is "
            f"(sync replaces only documents it read from {root})"
        )
        report.errors.append(SourceError(relative, message))
    return kept


def _ingest(ingestor: Ingestor, collection_id: str, pending: list[_Pending], report: SyncReport) -> set[str]:
    """Ingest the pending files' documents in batches; returns the ids written.

    A document the ingestor refuses (empty text, say) is an error of its file.
    """
    written: set[str] = set()
    owners = [file for file in pending for _ in file.documents]
    documents = [document for file in pending for document in file.documents]
    for start in range(0, len(documents), BATCH):
        result = ingestor.ingest(collection_id, documents[start : start + BATCH])
        written.update(result.document_ids)
        for error in result.errors:
            file = owners[start + error["index"]]
            file.failed += 1
            report.errors.append(SourceError(file.relative, f"{error['code']}: {error['message']}"))
    return written
