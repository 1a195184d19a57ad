"""`iris-rag sync`: make a collection's documents from a folder match the folder as it is now.

Files are told apart by their path relative to the folder (`source_path`) and compared by content hash
(`sha256`), both stored in each document's metadata at ingest. Only documents whose `source_root` is this
folder are looked at, so documents ingested as text or from another folder are never touched. Releases
before source_root existed stored only `source`; such a document whose `source` is the file sync finds at
its id (or, a record, whose file holds its id) is taken as this folder's and rewritten with its provenance.
A relative `source` (or a record's bare file name) fits any folder's file of that path: it counts only with
the text stored, and such a document is never deleted.

Each write and delete checks again, in its transaction, that the document is still this folder's (and, to
delete it, at the hash read): one another writer stored meanwhile stays. Nothing is deleted that sync could
not see: the documents of a file it could not read or parse whole, or under a folder it could not list, stay
as they are, and so do those an earlier release read from hidden files (reported in a note). A record id held
by two files of the folder stays with the file that has it (or, new, with the first in path order); the other
is reported on every sync.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import CollectionNotFoundError, InvalidParametersError
from iris_rag.ingestion.ingestor import Ingestor, stored_id
from iris_rag.ingestion.loaders import (
    SUPPORTED_SUFFIXES,
    CsvColumns,
    NotDecodable,
    SourceDocument,
    SourceError,
    SourceFile,
    decoded_text,
    find_files,
    parse_file,
    read_regular_file,
)
from iris_rag.stores.base import DocumentStore, StoredDocument
from iris_rag.stores.filters import Condition, MetadataFilter

BATCH = 256
MULTI_RECORD = {".jsonl", ".csv"}  # one document per record; any other file is one document, its path its id
SINGLE_DOCUMENT = SUPPORTED_SUFFIXES - MULTI_RECORD


@dataclass
class StoredFile:
    """What the collection holds of one file: its documents' ids, each with the file hash it was read at."""

    documents: dict[str, str | None] = field(default_factory=dict)

    def at(self, sha256: str) -> bool:
        """Whether every document of it was read from the file at this hash."""
        return bool(self.documents) and all(value == sha256 for value in self.documents.values())


@dataclass
class SyncReport:
    """What a sync did (or, dry, would do): files added, updated, unchanged and gone, documents deleted."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0  # files gone from the folder
    errors: list[SourceError] = field(default_factory=list)
    documents_deleted: int = 0  # every document deleted: of files gone and records gone from a file
    notes: list[str] = field(default_factory=list)  # worth saying, though nothing failed

    def summary(self) -> str:
        """One line for the terminal."""
        return (
            f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged, "
            f"{self.deleted} deleted, {len(self.errors)} errors; {self.documents_deleted} documents deleted"
        )


@dataclass
class _Present:
    """A file of the folder as this sync found it."""

    path: str
    relative: str
    stored: StoredFile | None
    documents: list[SourceDocument] | None = None  # None: left as stored (unchanged, or held)
    held: bool = False  # not read whole: its stored documents stay as they are
    claims: list[str] = field(default_factory=list)  # ids it keeps without a document read now
    writes: list[SourceDocument] = field(default_factory=list)  # documents to ingest
    dropped: int = 0  # of its documents, left out (an id another file or folder holds, or a duplicate)
    failed: int = 0  # of its writes, refused by the ingestor


def stored_files(store: DocumentStore, collection_id: str, root: Path) -> dict[str, StoredFile]:
    """The collection's documents read from files under root, by source path."""
    if store.get_collection(collection_id) is None:
        return {}
    metadata_filter = MetadataFilter((Condition("source_root", "eq", str(root)),))
    files: dict[str, StoredFile] = defaultdict(StoredFile)
    for document_id in sorted(store.matching_document_ids(collection_id, metadata_filter)):
        document = store.get_document(collection_id, document_id)
        relative = document.metadata.get("source_path") if document else None
        if document is None or not isinstance(relative, str):
            continue
        sha256 = document.metadata.get("sha256")
        files[relative].documents[document_id] = sha256 if isinstance(sha256, str) else None
    return dict(files)


def _legacy_files(
    store: DocumentStore, collection_id: str, root: Path, ours: set[str], adopted: dict[str, str]
) -> dict[str, StoredFile]:
    """Documents an older release read from single-document files under root, by path (each its id).

    Each is added to `adopted` with its `source`, which the write or delete checks again. Only ids that
    name such a file are read: once rewritten with source_root, they are the folder's like any other.
    """
    if store.get_collection(collection_id) is None:
        return {}
    files: dict[str, StoredFile] = {}
    for document_id in sorted(store.document_ids(collection_id)):
        if document_id in ours or not _relative_path(document_id):
            continue
        document = store.get_document(collection_id, document_id)
        source = _legacy_source(document)
        if document is not None and source is not None and _names(source, root / document_id, document):
            files[document_id] = StoredFile({document_id: None})
            adopted[document_id] = source
    return files


def _relative_path(document_id: str) -> bool:
    """Whether an id is a single-document file's path under a folder (its own normal form, not leaving it)."""
    if Path(document_id).suffix.lower() not in SINGLE_DOCUMENT or document_id.startswith("/"):
        return False
    return os.path.normpath(document_id) == document_id and not document_id.startswith("../")


def _legacy_source(document: StoredDocument | None) -> str | None:
    """The `source` of a document stored without source_root (by a release before it), else None."""
    if document is None or "source_root" in document.metadata:
        return None
    source = document.metadata.get("source")
    return source if isinstance(source, str) and source else None


def _names(source: str, path: Path, document: StoredDocument) -> bool:
    """Whether an older release's `source` is the file at path.

    It was the path given to `ingest` joined with the file's: absolute, it must lead to that file. Relative
    (to a working folder not recorded), it fits any folder's file of that path: only the file there now,
    holding the very text stored (as that release stored it, whole), is taken for it, never another
    folder's file of the same name.
    """
    if os.path.isabs(source):
        try:
            return Path(source).resolve() == path.resolve()
        except (OSError, RuntimeError):  # a symlink loop
            return False
    parts = Path(os.path.normpath(source)).parts
    while parts and parts[0] == "..":
        parts = parts[1:]
    if not parts or path.parts[-len(parts) :] != parts:
        return False
    data = read_regular_file(path)
    try:
        return not isinstance(data, SourceError) and decoded_text(data) == document.content
    except NotDecodable:
        return False


def _legacy_record_of(held: StoredDocument, path: Path, record: SourceDocument) -> bool:
    """Whether a document is a record an older release read from this .jsonl or .csv.

    It stored only the file's name, which any folder's file of that name has: the record must also be the
    one the file holds now under its id, its text unchanged.
    """
    if path.suffix.lower() not in MULTI_RECORD or _legacy_source(held) != path.name:
        return False
    return held.content == record.content


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
    existed = store.get_collection(collection_id) is not None
    stored = stored_files(store, collection_id, root)
    ours = {document_id for file in stored.values() for document_id in file.documents}
    adopted: dict[str, str] = {}  # documents of an older release taken as this folder's, with their source
    # A text file's id is its path, and none of theirs is this folder's yet: no path is both.
    stored |= _legacy_files(store, collection_id, root, ours, adopted)
    ours |= set(adopted)
    report = SyncReport()
    errors: list[tuple[int, SourceError]] = []  # each with its file's place in the walk, to report in order
    present: list[_Present] = []
    # Paths (relative) sync could not read, or does not: nothing at or under them is deleted. Hidden files
    # are left out of the walk; what a release that read them stored stays until deleted by id.
    hidden = sorted(relative for relative in stored if _hidden_entry(relative) is not None)
    unseen: list[str] = sorted({entry for relative in hidden if (entry := _hidden_entry(relative))})
    if hidden:
        held = sorted(d for relative in hidden for d in stored[relative].documents)
        report.notes.append(
            _kept_note(
                collection_id,
                held,
                "read from hidden files by an earlier release",
                "sync leaves hidden files and folders (a name starting with '.') out, and deletes nothing it "
                "does not read; to delete {them}",
            )
        )
    for item in find_files(root):
        place = len(present)
        if isinstance(item, SourceError):
            errors.append((place, item))
            if (relative := _relative(item.location, root)) is not None:
                unseen.append(relative)
            continue
        file = _read(item, stored.get(item.relative), csv_columns, errors, place)
        if file is None:
            unseen.append(item.relative)
        else:
            present.append(file)

    owners = _owners(present, stored, unseen, errors)
    for place, file in enumerate(present):
        if file.documents is None:
            continue
        kept = _not_held_elsewhere(store, collection_id, root, ours, adopted, file, errors, place)
        before = file.stored.documents if file.stored else {}
        file.writes = [d for d in kept if before.get(stored_id(d)) != d.metadata.get("sha256")]

    stale: dict[str, str | None] = {}  # documents to delete (their file is gone, or no longer holds them)
    stale_in: dict[str, str] = {}  # with the hash each was read at, and the file each was read from
    found = {file.relative for file in present}
    # An older release's document known only by a relative source was taken as this folder's because its
    # file is here: one the walk did not find after all (reached through a linked folder, or removed
    # meanwhile) may be another folder's, and is never deleted on that evidence.
    unproven: list[str] = []
    for relative, file_stored in stored.items():
        if _under(relative, unseen):
            continue  # it, or a folder above it, could not be read: not gone
        for document_id, sha256 in file_stored.documents.items():
            if document_id in owners:
                continue
            if document_id in adopted and not os.path.isabs(adopted[document_id]):
                unproven.append(document_id)
                unseen.append(relative)
                continue
            stale[document_id] = sha256
            stale_in[document_id] = relative
    if unproven:
        report.notes.append(
            _kept_note(
                collection_id,
                unproven,
                "an older release stored with a relative source",
                "sync did not find {them} in this folder, and another folder may hold {them}; if gone, "
                "delete {them}",
            )
        )
    stale_files = set(stale_in.values())
    # An id that moved to another file (a record from one .jsonl to another) is written again there.
    _ingest(ingestor, collection_id, root, present, errors, adopted, dry_run=dry_run, existed=existed)
    deleted = stale if dry_run else _delete(store, collection_id, root, stale, adopted)
    report.documents_deleted = len(deleted)
    # A gone file whose documents another writer deleted or replaced first was not deleted by this sync.
    gone = [r for r in stored if r not in found and not _under(r, unseen)]
    left = {stale_in[d] for d in stale} - {stale_in[d] for d in deleted}
    report.deleted = len([r for r in gone if r not in left])
    for file in present:
        if file.held:
            continue  # an error (reported): neither added, updated nor unchanged
        if file.documents is None or not (file.writes or file.relative in stale_files):
            if file.stored is None and file.dropped:
                continue  # every document of it left out (reported): nothing of it is stored
            report.unchanged += 1
        elif file.writes and file.failed == len(file.writes) and file.relative not in stale_files:
            continue  # every document of it refused (reported): neither added nor updated
        elif file.stored is None:
            report.added += 1
        else:
            report.updated += 1
    report.errors = [error for _, error in sorted(errors, key=lambda pair: pair[0])]
    return report


def _read(
    item: SourceFile,
    before: StoredFile | None,
    csv_columns: CsvColumns | None,
    errors: list[tuple[int, SourceError]],
    place: int,
) -> _Present | None:
    """A found file, parsed unless unchanged; None when it could not be read (reported)."""
    data = read_regular_file(item.path)
    if isinstance(data, SourceError):
        errors.append((place, data))
        return None
    multi = item.path.suffix.lower() in MULTI_RECORD
    if not multi and before is not None and before.at(hashlib.sha256(data).hexdigest()):
        return _Present(str(item.path), item.relative, before, claims=list(before.documents))
    # A .jsonl or .csv is parsed every time, unchanged or not: its record ids are needed to tell which
    # of the folder's files holds an id (and to report a clash every time, not only when a file changes).
    parsed = list(parse_file(item, data, csv_columns=csv_columns))
    problems = [entry for entry in parsed if isinstance(entry, SourceError)]
    documents = [entry for entry in parsed if isinstance(entry, SourceDocument)]
    errors += [(place, problem) for problem in problems]
    if any(not problem.record for problem in problems):
        # Records that did not parse have no id to tell them by: deleting what was not read now could
        # delete them. The file waits, whole, until it parses whole: never half old and half new.
        held = list(before.documents) if before else []
        if multi:
            count = len(problems)
            kept = (
                f"its {len(held)} stored documents are kept as they were"
                if held
                else "none of its records is stored until it does"
            )
            message = f"not synced: it did not read whole ({count} error{'s' * (count != 1)} above); {kept}"
            errors.append((place, SourceError(str(item.path), message)))
        return _Present(str(item.path), item.relative, before, held=True, claims=held)
    claims = [problem.record_id for problem in problems if problem.record_id is not None]
    return _Present(str(item.path), item.relative, before, documents=documents, claims=claims)


def _owners(
    present: list[_Present],
    stored: dict[str, StoredFile],
    unseen: list[str],
    errors: list[tuple[int, SourceError]],
) -> dict[str, str]:
    """Which file of the folder each id read now (or kept) belongs to; the others holding it are reported.

    An id stays with the file it was stored from while that file still holds it (so an unchanged folder
    never swaps one file's records for another's); a new id goes to the first file in path order. A file's
    documents are left with only those it owns, each id once.
    """
    stored_from = {d: relative for relative, file in stored.items() for d in file.documents}
    owners = {
        d: relative for relative, file in stored.items() if _under(relative, unseen) for d in file.documents
    }
    for file in present:
        for document_id in [*file.claims, *(stored_id(d) for d in file.documents or [])]:
            if stored_from.get(document_id) == file.relative:
                owners.setdefault(document_id, file.relative)
    for place, file in enumerate(present):
        for document_id in file.claims:
            owners.setdefault(document_id, file.relative)
        if file.documents is None:
            continue
        kept: list[SourceDocument] = []
        seen: set[str] = set()
        for document in file.documents:
            document_id = stored_id(document)
            owner = owners.setdefault(document_id, file.relative)
            if document_id in seen:
                message = (
                    f"document id {document_id!r} appears more than once in this file; the first is kept"
                )
            elif owner != file.relative:
                message = f"document id {document_id!r} is also in {owner}, which keeps it; not synced"
            else:
                seen.add(document_id)
                kept.append(document)
                continue
            errors.append((place, SourceError(file.path, message)))
            file.dropped += 1
        file.documents = kept
    return owners


def _relative(location: str, root: Path) -> str | None:
    """The path of a walk error's location relative to root ("." for root itself), or None if not under it."""
    relative = os.path.relpath(location, root)
    return None if relative == ".." or relative.startswith("../") else Path(relative).as_posix()


def _hidden_entry(relative: str) -> str | None:
    """The hidden file or folder (left out of the walk) that a path under the folder is or lies under."""
    parts = relative.split("/")
    hidden = next((i for i, part in enumerate(parts) if part.startswith(".")), None)
    return None if hidden is None else "/".join(parts[: hidden + 1])


def _kept_note(collection_id: str, document_ids: list[str], stored: str, why: str) -> str:
    """What sync says of documents it keeps without reading them, and the command that deletes them.

    stored: who stored them ("read from hidden files by an earlier release"); why: why they are kept, with
    {them} where the pronoun goes.
    """
    count = len(document_ids)
    them = "it" if count == 1 else "them"
    ids = " ".join(shlex.quote(d) for d in document_ids)
    return (
        f"{count} document{'s' * (count != 1)} {stored} {'is' if count == 1 else 'are'} kept: "
        f"{why.format(them=them)}: iris-rag delete --collection {shlex.quote(collection_id)} {ids}"
    )


def _under(relative: str, folders: list[str]) -> bool:
    """Whether a path is one of these, or under one ("." holds everything)."""
    return any(f in (".", relative) or relative.startswith(f + "/") for f in folders)


def _not_held_elsewhere(
    store: DocumentStore,
    collection_id: str,
    root: Path,
    ours: set[str],
    adopted: dict[str, str],
    file: _Present,
    errors: list[tuple[int, SourceError]],
    place: int,
) -> list[SourceDocument]:
    """The file's documents whose id no document from elsewhere holds; the others are reported and left.

    An id is a path relative to its folder, so two folders' `notes.txt`, or a document sent as text with
    that id, are one document: replacing it would break the promise that sync touches only this folder's.
    A record an older release stored with this file's name as its `source` is this file's (`adopted`).
    """
    kept = []
    for document in file.documents or []:
        held = (
            None
            if document.id is None or document.id in ours
            else store.get_document(collection_id, document.id)
        )
        if held is not None and _legacy_record_of(held, Path(file.path), document):
            adopted[held.id] = Path(file.path).name
            ours.add(held.id)
            file.stored = file.stored or StoredFile()
            file.stored.documents[held.id] = None
            held = None
        if held is None:
            kept.append(document)
            continue
        errors.append((place, SourceError(file.relative, _held_message(collection_id, root, held))))
        file.dropped += 1
    return kept


def _held_elsewhere(store: DocumentStore, collection_id: str, root: Path, document_id: str) -> str:
    """Why a document the ingest left as it was (written meanwhile by someone else) was not synced."""
    held = store.get_document(collection_id, document_id)
    if held is None:  # deleted again since
        return f"document id {document_id!r} was written by someone else during this sync; left as it is"
    return _held_message(collection_id, root, held)


def _held_message(collection_id: str, root: Path, held: StoredDocument) -> str:
    """Why a file's document was not synced: its id holds a document from elsewhere, and what to do.

    A folder that moved (renamed) is another folder to sync: its old documents hold every id, on every
    sync, until they are deleted; the message names the command that deletes them.
    """
    owner = held.metadata.get("source_root")
    where = f"from the folder {owner}" if isinstance(owner, str) else "not read from a folder"
    message = (
        f"document id {held.id!r} is already in {collection_id!r}, {where}; left as it is "
        f"(sync replaces only documents it read from {root})"
    )
    if not isinstance(owner, str):
        collection = shlex.quote(collection_id)
        return (
            f"{message}; if an older release read it from this folder, ingest the folder once to sync it "
            f"from now on: iris-rag ingest {shlex.quote(str(root))} --collection {collection}; "
            f"else delete it: iris-rag delete --collection {collection} {shlex.quote(held.id)}"
        )
    source_filter = shlex.quote(json.dumps({"source_root": owner}, ensure_ascii=False))
    return (
        f"{message}; if that folder moved here, delete its documents first: iris-rag delete "
        f"--collection {shlex.quote(collection_id)} --filter {source_filter}"
    )


def _ingest(
    ingestor: Ingestor,
    collection_id: str,
    root: Path,
    present: list[_Present],
    errors: list[tuple[int, SourceError]],
    adopted: dict[str, str],
    *,
    dry_run: bool,
    existed: bool,
) -> None:
    """Ingest the files' writes in batches; dry: only check them, as the ingest does.

    A document the ingestor refuses (empty text, say) is an error of its file, and so is one that another
    writer stored meanwhile under its id, not from this folder (sent as text): it is left as it is. A
    collection that `existed` when the sync began and is gone at a write was deleted meanwhile: the write
    would bring it back, with only this batch, so it is CollectionNotFoundError instead.
    """
    owners = [(place, file) for place, file in enumerate(present) for _ in file.writes]
    documents = [document for file in present for document in file.writes]
    store = ingestor.store

    def ours(document_id: str) -> bool:
        held = store.get_document(collection_id, document_id)
        if held is None and existed and store.get_collection(collection_id) is None:
            raise _deleted_meanwhile(collection_id)
        return held is None or _still_ours(held, root, adopted)

    for start in range(0, len(documents), BATCH):
        batch = documents[start : start + BATCH]
        if dry_run:
            refused, left = ingestor.screen(batch)[1], []
        else:
            result = ingestor.ingest(collection_id, batch, only_if=ours)
            refused, left = result.errors, result.left
        problems = [(error["index"], f"{error['code']}: {error['message']}") for error in refused]
        position = {stored_id(document): i for i, document in enumerate(batch)}
        problems += [(position[d], _held_elsewhere(store, collection_id, root, d)) for d in left]
        for index, message in problems:
            place, file = owners[start + index]
            file.failed += 1
            errors.append((place, SourceError(file.relative, message)))


def _delete(
    store: DocumentStore,
    collection_id: str,
    root: Path,
    stale: dict[str, str | None],
    adopted: dict[str, str],
) -> list[str]:
    """Delete the documents still as this sync read them (from this folder, at that hash); those deleted.

    Checked in the delete's transaction, once the collection's other writers are done: a document written
    meanwhile under such an id (sent as text, another sync's newer file) stays, and one another sync
    deleted first is not counted twice.
    """
    deleted = []
    with store.collection_transaction(collection_id):
        if stale and store.get_collection(collection_id) is None:
            raise _deleted_meanwhile(collection_id)
        for document_id, sha256 in stale.items():
            check_cancelled()
            held = store.get_document(collection_id, document_id)
            if held is None or not _still_ours(held, root, adopted):
                continue
            if held.metadata.get("sha256") != sha256:
                continue
            if store.delete_document(collection_id, document_id):
                deleted.append(document_id)
    return deleted


def _deleted_meanwhile(collection_id: str) -> CollectionNotFoundError:
    msg = f"collection {collection_id!r} does not exist (deleted while it was synced)"
    return CollectionNotFoundError(msg)


def _still_ours(held: StoredDocument, root: Path, adopted: dict[str, str]) -> bool:
    """Whether a stored document is this folder's: read from it, or an older release's as sync found it."""
    if "source_root" in held.metadata:
        return bool(held.metadata["source_root"] == str(root))
    return held.id in adopted and held.metadata.get("source") == adopted[held.id]
