"""`iris-rag sync`: a folder's new and changed files go in, removed ones come out, the rest is left alone."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from iris_rag import cli
from iris_rag.embedder import Embedder
from iris_rag.errors import CollectionNotFoundError
from iris_rag.ingestion import sync
from iris_rag.ingestion.loaders import SourceDocument, SourceFile, read_file
from iris_rag.ingestion.sync import SyncReport, sync_folder
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.ingestion.make_files import write_pdf
from tests.ingestion.other_writer import before_each_write
from tests.ingestion.test_loaders import unreadable


def _sync(service: RagService, folder: Path, *, dry_run: bool = False) -> SyncReport:
    return sync_folder(folder, "notes", store=service.store, ingestor=service.ingestor, dry_run=dry_run)


def _ids(service: RagService) -> list[str]:
    return sorted(service.store.document_ids("notes"))


def _counts(report: SyncReport) -> tuple[int, int, int, int, int]:
    return report.added, report.updated, report.unchanged, report.deleted, len(report.errors)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "a.md").write_text("# A\n\nAnts live in colonies.", encoding="utf-8")
    (notes / "sub" / "b.txt").write_text("Bats hunt by echolocation.", encoding="utf-8")
    (notes / "records.jsonl").write_text(
        '{"_id": "r1", "text": "Rivers carry silt."}\n{"_id": "r2", "text": "Rain feeds rivers."}\n',
        encoding="utf-8",
    )
    write_pdf(notes / "c.pdf", ["Cats sleep most of the day."])
    return notes


def test_add_update_unchanged_delete(any_service: RagService, folder: Path) -> None:
    assert _counts(_sync(any_service, folder)) == (4, 0, 0, 0, 0)
    assert _ids(any_service) == ["a.md", "c.pdf", "r1", "r2", "sub/b.txt"]

    assert _counts(_sync(any_service, folder)) == (0, 0, 4, 0, 0)

    (folder / "a.md").write_text("# A\n\nAnts farm aphids.", encoding="utf-8")
    (folder / "sub" / "b.txt").unlink()
    (folder / "records.jsonl").write_text('{"_id": "r1", "text": "Rivers carry silt."}\n', encoding="utf-8")
    (folder / "d.txt").write_text("Dogs were domesticated long ago.", encoding="utf-8")
    assert _counts(_sync(any_service, folder)) == (1, 2, 1, 1, 0)
    assert _ids(any_service) == ["a.md", "c.pdf", "d.txt", "r1"]
    stored = any_service.store.get_document("notes", "a.md")
    assert stored is not None and "aphids" in stored.content


def test_dry_run_counts_and_changes_nothing(any_service: RagService, folder: Path) -> None:
    _sync(any_service, folder)
    (folder / "a.md").unlink()
    (folder / "e.txt").write_text("Eels migrate to the sea.", encoding="utf-8")
    before = any_service.store.data_version("notes")
    assert _counts(_sync(any_service, folder, dry_run=True)) == (1, 0, 3, 1, 0)
    assert any_service.store.data_version("notes") == before
    assert "a.md" in _ids(any_service) and "e.txt" not in _ids(any_service)


def test_documents_not_from_this_folder_are_left_alone(
    any_service: RagService, folder: Path, tmp_path: Path
) -> None:
    any_service.ingest(
        {"collection_id": "notes", "documents": [{"id": "typed", "content": "Typed by a client."}]}
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "z.txt").write_text("Zebras have stripes.", encoding="utf-8")
    _sync(any_service, other)
    assert _counts(_sync(any_service, folder)) == (4, 0, 0, 0, 0)
    assert {"typed", "z.txt"} <= set(_ids(any_service))


def test_a_document_id_held_by_another_folder_or_sent_as_text_is_left_alone_and_reported(
    any_service: RagService, folder: Path, tmp_path: Path
) -> None:
    """The same relative path in two folders (or a text document with that id) is one document id."""
    any_service.ingest(
        {"collection_id": "notes", "documents": [{"id": "r1", "content": "Typed by a client."}]}
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.md").write_text("# Other A\n\nAardvarks eat ants.", encoding="utf-8")
    assert _counts(_sync(any_service, other)) == (1, 0, 0, 0, 0)
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert _counts(report) == (3, 0, 0, 0, 2), dry_run  # a.md refused; records.jsonl keeps r2 only
        assert sorted(Path(e.location).name for e in report.errors) == ["a.md", "records.jsonl"]
        assert all("left as it is" in e.message for e in report.errors)
    kept = any_service.store.get_document("notes", "a.md")
    typed = any_service.store.get_document("notes", "r1")
    assert kept is not None and "Aardvarks" in kept.content
    assert typed is not None and typed.content == "Typed by a client."
    assert _counts(_sync(any_service, other)) == (0, 0, 1, 0, 0), (
        "the other folder's document is still its own"
    )


def test_a_file_that_stops_parsing_keeps_its_document_and_is_an_error(
    any_service: RagService, folder: Path
) -> None:
    _sync(any_service, folder)
    (folder / "c.pdf").write_bytes(b"%PDF-1.7\ntruncated")
    (folder / "empty.txt").write_text("", encoding="utf-8")
    report = _sync(any_service, folder)
    assert _counts(report) == (0, 0, 3, 0, 2)
    assert sorted(Path(e.location).name for e in report.errors) == ["c.pdf", "empty.txt"]
    assert "c.pdf" in _ids(any_service)


def test_cli_prints_one_summary_line_and_fails_on_errors(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_TECHNIQUES", "basic")
    assert cli.main(["sync", str(folder), "--collection", "notes", "--dry-run"]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("4 added, 0 updated, 0 unchanged, 0 deleted, 0 errors; 0 documents deleted")
    )
    (folder / "bad.docx").write_bytes(b"not a docx")
    assert cli.main(["sync", str(folder), "--collection", "notes"]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip().endswith(
        "4 added, 0 updated, 0 unchanged, 0 deleted, 1 errors; 0 documents deleted"
    )
    assert "bad.docx" in captured.err


def _content(service: RagService, document_id: str) -> str | None:
    stored = service.store.get_document("notes", document_id)
    return None if stored is None else stored.content


def test_a_csv_or_jsonl_that_does_not_parse_whole_keeps_every_stored_document(
    any_service: RagService, folder: Path
) -> None:
    """An unclosed quote stops the CSV reader and a JSONL typo loses its line: neither may delete a record."""
    rows = ["id,text", *(f"{i},Row {i} describes product number {i}." for i in range(1, 11))]
    (folder / "products.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    _sync(any_service, folder)
    assert len(_ids(any_service)) == 15
    before = {document_id: _content(any_service, document_id) for document_id in _ids(any_service)}
    # Row 1 edited, row 2 given an opening quote never closed; r1 edited, r2's line broken.
    rows[1] = "1,Row 1 now describes product one."
    rows[2] = '2,"Row 2 now describes product two.'
    (folder / "products.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (folder / "records.jsonl").write_text(
        '{"_id": "r1", "text": "Rivers carry sand."}\n{"_id": "r2", "text": "Rain feeds rivers.}\n',
        encoding="utf-8",
    )
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert _counts(report) == (0, 0, 3, 0, 4), dry_run
        assert report.documents_deleted == 0
        assert [Path(e.location).name for e in report.errors] == [
            "products.csv:3",
            "products.csv",
            "records.jsonl:2",
            "records.jsonl",
        ]
        assert report.errors[0].message.startswith("a quoted field is never closed")
        assert report.errors[2].message.startswith("invalid JSON")
        assert report.errors[1].message == (
            "not synced: it did not read whole (1 error above); its 10 stored documents are kept as they were"
        )
        assert {d: _content(any_service, d) for d in _ids(any_service)} == before
    # The CSV fixed: it goes in whole, and the records it no longer holds are deleted and counted.
    rows[2] = "2,Row 2 now describes product two."
    del rows[5:]
    (folder / "products.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert (_counts(report), report.documents_deleted) == ((0, 1, 3, 0, 2), 6), dry_run
    assert _content(any_service, "2") == "Row 2 now describes product two."
    assert _content(any_service, "r1") == "Rivers carry silt."  # records.jsonl is still held back
    assert sorted(set(before) - set(_ids(any_service))) == ["10", "5", "6", "7", "8", "9"]


def test_every_document_deleted_is_counted_in_the_summary(any_service: RagService, folder: Path) -> None:
    _sync(any_service, folder)
    (folder / "records.jsonl").write_text('{"_id": "r1", "text": "Rivers carry silt."}\n', encoding="utf-8")
    (folder / "a.md").unlink()
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert (_counts(report), report.documents_deleted) == ((0, 1, 2, 1, 0), 2), dry_run
        assert report.summary() == "0 added, 1 updated, 2 unchanged, 1 deleted, 0 errors; 2 documents deleted"
    assert _ids(any_service) == ["c.pdf", "r1", "sub/b.txt"]


def test_an_emptied_jsonl_or_csv_has_its_records_deleted(any_service: RagService, folder: Path) -> None:
    (folder / "rows.csv").write_text("id,text\nx,Row x about the genet.\n", encoding="utf-8")
    (folder / "gone.csv").write_text("id,text\ny,Row y about the civet.\n", encoding="utf-8")
    _sync(any_service, folder)
    assert {"r1", "r2", "x", "y"} <= set(_ids(any_service))
    (folder / "records.jsonl").write_text("", encoding="utf-8")
    (folder / "rows.csv").write_text("id,text\n", encoding="utf-8")
    (folder / "gone.csv").write_text("", encoding="utf-8")  # not even a header: no records either
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert (_counts(report), report.documents_deleted) == ((0, 3, 3, 0, 0), 4), dry_run
    assert _ids(any_service) == ["a.md", "c.pdf", "sub/b.txt"]
    report = _sync(any_service, folder)
    assert (_counts(report), report.documents_deleted) == ((0, 0, 6, 0, 0), 0)


def test_records_sharing_an_id_across_files_are_stable_and_reported_every_time(
    any_service: RagService, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "veg.csv").write_text("id,text\n1,Carrots are orange.\n2,Peas are green.\n", encoding="utf-8")
    report = _sync(any_service, docs)
    assert _counts(report) == (1, 0, 0, 0, 0)
    # A file that sorts first, holding the same ids, comes later: the ids stay veg.csv's.
    (docs / "fruit.csv").write_text("id,text\n1,Apples are red.\n2,Bananas are yellow.\n3,Figs.\n", "utf-8")
    for run in range(3):
        report = _sync(any_service, docs)
        expected = (1, 0, 1, 0, 2) if run == 0 else (0, 0, 2, 0, 2)  # fruit.csv's 3 goes in once
        assert _counts(report) == expected, run
        assert [(Path(e.location).name, e.message) for e in report.errors] == [
            ("fruit.csv", f"document id {i!r} is also in veg.csv, which keeps it; not synced")
            for i in ("1", "2")
        ]
        assert [_content(any_service, i) for i in ("1", "2", "3")] == [
            "Carrots are orange.",
            "Peas are green.",
            "Figs.",
        ]
    # veg.csv gone: its ids are fruit.csv's now, written and not deleted.
    (docs / "veg.csv").unlink()
    report = _sync(any_service, docs)
    assert (_counts(report), report.documents_deleted) == ((0, 1, 0, 1, 0), 0)
    assert [_content(any_service, i) for i in ("1", "2", "3")] == [
        "Apples are red.",
        "Bananas are yellow.",
        "Figs.",
    ]


def test_two_new_files_with_one_id_the_first_in_path_order_wins(
    any_service: RagService, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "b.jsonl").write_text('{"_id": "k", "text": "From b."}\n', encoding="utf-8")
    (docs / "a.jsonl").write_text(
        '{"_id": "k", "text": "From a."}\n{"_id": "k", "text": "Again a."}\n', "utf-8"
    )
    for run in range(3):
        report = _sync(any_service, docs)
        assert [(Path(e.location).name, e.message) for e in report.errors] == [
            ("a.jsonl", "document id 'k' appears more than once in this file; the first is kept"),
            ("b.jsonl", "document id 'k' is also in a.jsonl, which keeps it; not synced"),
        ], run
        assert _content(any_service, "k") == "From a."


def test_a_duplicate_id_far_apart_in_one_file_keeps_the_first(
    any_service: RagService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync, "BATCH", 2)  # the duplicate lands in another ingest batch
    docs = tmp_path / "docs"
    docs.mkdir()
    lines = [
        '{"_id": "far", "text": "First far."}',
        *(f'{{"_id": "n{i}", "text": "Filler {i}."}}' for i in range(3)),
    ]
    (docs / "far.jsonl").write_text("\n".join([*lines, '{"_id": "far", "text": "Second far."}']), "utf-8")
    report = _sync(any_service, docs)
    assert _counts(report) == (1, 0, 0, 0, 1)
    assert _content(any_service, "far") == "First far."


def test_an_unreadable_subfolder_is_an_error_and_its_documents_stay(
    any_service: RagService, folder: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    (folder / "sub" / "c.md").write_text("Crows use tools.", encoding="utf-8")
    _sync(any_service, folder)
    unreadable(folder / "sub", monkeypatch, request)
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert (_counts(report), report.documents_deleted) == ((0, 0, 3, 0, 1), 0), dry_run
        assert [(e.location, e.message) for e in report.errors] == [
            (str(folder / "sub"), "cannot read this folder (Permission denied); the files in it were skipped")
        ]
    assert {"sub/b.txt", "sub/c.md"} <= set(_ids(any_service))


def test_an_unreadable_folder_itself_deletes_nothing(
    any_service: RagService, folder: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    _sync(any_service, folder)
    unreadable(folder, monkeypatch, request)
    report = _sync(any_service, folder)
    assert (_counts(report), report.documents_deleted) == ((0, 0, 0, 0, 1), 0)
    assert len(_ids(any_service)) == 5


def test_a_file_name_that_is_not_utf8_is_reported_and_the_rest_synced(
    any_service: RagService, folder: Path
) -> None:
    with open(os.fsencode(folder) + b"/caf\xe9.txt", "wb") as handle:
        handle.write(b"A Latin-1 named file about the quetzal.\n")
    report = _sync(any_service, folder)
    assert _counts(report) == (4, 0, 0, 0, 1)
    assert report.errors[0].message == "file name is not valid UTF-8; rename it"
    assert len(_ids(any_service)) == 5


def test_a_document_sent_as_text_meanwhile_under_a_gone_files_id_is_not_deleted(
    any_service: RagService, other: RagService, folder: Path
) -> None:
    _sync(any_service, folder)
    (folder / "sub" / "b.txt").unlink()
    (folder / "a.md").write_text("# A\n\nAnts farm aphids.", encoding="utf-8")
    typed = {"collection_id": "notes", "documents": [{"id": "sub/b.txt", "content": "Typed by a client."}]}
    before_each_write(any_service, lambda: other.ingest(typed))
    report = _sync(any_service, folder)
    assert (_counts(report), report.documents_deleted) == ((0, 1, 2, 0, 0), 0)
    assert _content(any_service, "sub/b.txt") == "Typed by a client."


def test_a_document_sent_as_text_meanwhile_under_a_new_files_id_is_not_replaced(
    any_service: RagService, other: RagService, folder: Path
) -> None:
    _sync(any_service, folder)
    (folder / "d.txt").write_text("Dogs were domesticated long ago.", encoding="utf-8")
    typed = {"collection_id": "notes", "documents": [{"id": "d.txt", "content": "Typed by a client."}]}
    before_each_write(any_service, lambda: other.ingest(typed))
    report = _sync(any_service, folder)
    assert _counts(report) == (0, 0, 4, 0, 1)
    assert report.errors[0].message.startswith(
        "document id 'd.txt' is already in 'notes', not read from a folder; left as it is"
    )
    assert _content(any_service, "d.txt") == "Typed by a client."


def test_two_syncs_at_once_count_only_what_each_deleted(
    any_service: RagService, other: RagService, folder: Path
) -> None:
    _sync(any_service, folder)
    (folder / "sub" / "b.txt").unlink()
    (folder / "a.md").write_text("# A\n\nAnts farm aphids.", encoding="utf-8")
    first: list[SyncReport] = []
    before_each_write(any_service, lambda: first.append(_sync(other, folder)))
    second = _sync(any_service, folder)
    assert (_counts(first[0]), first[0].documents_deleted) == ((0, 1, 2, 1, 0), 1)
    assert (_counts(second), second.documents_deleted) == ((0, 1, 2, 0, 0), 0)
    assert _ids(any_service) == ["a.md", "c.pdf", "r1", "r2"]


def test_the_dry_run_refuses_what_the_ingest_refuses(any_service: RagService, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text("Good file.", encoding="utf-8")
    (docs / "empty.txt").write_text("", encoding="utf-8")
    (docs / "fm.md").write_text("---\ntitle: Only front matter\n---\n", encoding="utf-8")
    (docs / "rows.jsonl").write_text('{"_id": "x", "text": "  "}\n', encoding="utf-8")
    expected = [(1, 0, 0, 0, 3), (1, 0, 0, 0, 3), (0, 0, 1, 0, 3)]  # dry, real, dry again
    for dry_run, counts in zip((True, False, True), expected, strict=True):
        report = _sync(any_service, docs, dry_run=dry_run)
        assert _counts(report) == counts, dry_run
        assert sorted(Path(e.location).name for e in report.errors) == ["empty.txt", "fm.md", "rows.jsonl"]
    assert _ids(any_service) == ["good.txt"]


def test_a_moved_folder_is_told_how_to_sync_into_the_same_collection(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_TECHNIQUES", "basic")
    assert cli.main(["sync", str(folder), "--collection", "notes"]) == 0
    moved = folder.rename(tmp_path / "moved")
    capsys.readouterr()
    assert cli.main(["sync", str(moved), "--collection", "notes"]) == 1
    command = f'iris-rag delete --collection notes --filter \'{{"source_root": "{folder}"}}\''
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 5
    assert all(
        line.endswith(f"if that folder moved here, delete its documents first: {command}") for line in errors
    )
    assert cli.main(["delete", *shlex.split(command)[2:]]) == 0
    capsys.readouterr()
    assert cli.main(["sync", str(moved), "--collection", "notes"]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("4 added, 0 updated, 0 unchanged, 0 deleted, 0 errors; 0 documents deleted")
    )


def test_hidden_files_and_folders_are_not_synced(any_service: RagService, folder: Path) -> None:
    (folder / ".git").mkdir()
    (folder / ".git" / "notes.md").write_text("A file of the version control.", encoding="utf-8")
    (folder / ".hidden.md").write_text("An editor's hidden file.", encoding="utf-8")
    (folder / "sub" / ".cache").mkdir()
    (folder / "sub" / ".cache" / "c.txt").write_text("Cached.", encoding="utf-8")
    assert _counts(_sync(any_service, folder)) == (4, 0, 0, 0, 0)
    assert _ids(any_service) == ["a.md", "c.pdf", "r1", "r2", "sub/b.txt"]


def test_documents_read_from_hidden_files_before_they_were_left_out_are_kept_and_reported(
    folder: Path,
    tmp_path: Path,
    embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A release that walked hidden entries stored .github/CONTRIBUTING.md: no sync deletes it unasked."""
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_TECHNIQUES", "basic")
    assert cli.main(["sync", str(folder), "--collection", "notes"]) == 0
    hidden = folder / ".github" / "CONTRIBUTING.md"
    hidden.parent.mkdir()
    hidden.write_text("# Contributing\n\nHow to send patches.", encoding="utf-8")
    older = RagService(Settings(RAG_DATA_DIR=tmp_path / "data", RAG_TECHNIQUES="basic"), embedder=embedder)
    try:  # as that release stored it: read from this folder, its path the id
        stat = hidden.stat()
        read = read_file(SourceFile(hidden, folder.resolve(), stat.st_size, stat.st_mtime))
        documents = [document for document in read if isinstance(document, SourceDocument)]
        assert older.ingestor.ingest("notes", documents).document_ids == [".github/CONTRIBUTING.md"]
    finally:
        older.close()
    capsys.readouterr()
    for _ in range(2):  # reported on every sync, and never an error
        assert cli.main(["sync", str(folder), "--collection", "notes"]) == 0
        out, err = capsys.readouterr()
        summary = "0 added, 0 updated, 4 unchanged, 0 deleted, 0 errors; 0 documents deleted"
        assert out.strip().endswith(summary)
        [note] = err.splitlines()
        command = "iris-rag delete --collection notes .github/CONTRIBUTING.md"
        assert note.startswith("note: 1 document read from hidden files") and note.endswith(command)
    assert cli.main(shlex.split(command)[1:]) == 0
    capsys.readouterr()
    assert cli.main(["sync", str(folder), "--collection", "notes"]) == 0
    assert capsys.readouterr().err == ""


def test_a_collection_deleted_during_a_sync_is_not_brought_back(
    any_service: RagService, other: RagService, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sync(any_service, folder)
    (folder / "a.md").write_text("# A\n\nAnts farm aphids.", encoding="utf-8")
    before_each_write(any_service, lambda: other.store.delete_collection("notes"))
    with pytest.raises(CollectionNotFoundError, match="'notes'"):
        _sync(any_service, folder)
    assert any_service.store.get_collection("notes") is None
    # Deleted before the sync deletes a gone file's documents, with nothing to write: said so too.
    _sync(other, folder)
    (folder / "sub" / "b.txt").unlink()
    delete = sync._delete

    def delete_after(store: Any, collection_id: str, *args: Any) -> list[str]:
        other.store.delete_collection(collection_id)
        return delete(store, collection_id, *args)

    monkeypatch.setattr(sync, "_delete", delete_after)
    with pytest.raises(CollectionNotFoundError, match="'notes'"):
        _sync(any_service, folder)


def _ingest_as_an_older_release(service: RagService, documents: dict[str, tuple[str, str | None]]) -> None:
    """Store documents as releases before fd3cf21 left them: metadata.source only, no source_root or sha256.

    Text files had the path given to `ingest` joined with the file's (absolute, or relative to the working
    folder); .jsonl and .csv records the file's name.
    """
    batch = [
        SourceDocument(document_id, content, "", {} if source is None else {"source": source})
        for document_id, (content, source) in documents.items()
    ]
    assert service.ingestor.ingest("notes", batch).errors == []


def test_documents_an_older_release_read_from_the_folder_are_synced_as_its_own(
    any_service: RagService, folder: Path, tmp_path: Path
) -> None:
    (folder / "gone.md").write_text("Gnus migrate.", encoding="utf-8")
    legacy = {
        "a.md": ("# A\n\nAnts live in colonies.", str(folder / "a.md")),
        "sub/b.txt": ("Bats hunt by echolocation.", "notes/sub/b.txt"),  # ingested from tmp_path
        "gone.md": ("Gnus migrate.", str(folder / "gone.md")),
        "r1": ("Rivers carry silt.", "records.jsonl"),
        # Not this folder's: another folder's file, one sent as text, a record no file of it holds.
        "c.pdf": ("Cats from elsewhere.", str(tmp_path / "elsewhere" / "c.pdf")),
        "old.md": ("Owls from elsewhere.", str(tmp_path / "elsewhere" / "old.md")),
        "typed.md": ("Typed by a client.", None),
        "r9": ("A record of another records.jsonl.", "records.jsonl"),
    }
    _ingest_as_an_older_release(any_service, legacy)
    (folder / "a.md").write_text("# A\n\nAnts farm aphids.", encoding="utf-8")
    (folder / "gone.md").unlink()
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert (_counts(report), report.documents_deleted) == ((0, 3, 0, 1, 1), 1), dry_run
        assert [Path(e.location).name for e in report.errors] == ["c.pdf"]
        assert report.errors[0].message.startswith(
            "document id 'c.pdf' is already in 'notes', not read from a folder; left as it is"
        )
        assert report.errors[0].message.endswith(
            f"if an older release read it from this folder, ingest the folder once to sync it from now on: "
            f"iris-rag ingest {folder} --collection notes; else delete it: "
            f"iris-rag delete --collection notes c.pdf"
        )
    assert _ids(any_service) == ["a.md", "c.pdf", "old.md", "r1", "r2", "r9", "sub/b.txt", "typed.md"]
    assert _content(any_service, "a.md") == "# A\n\nAnts farm aphids."
    for document_id in ("a.md", "sub/b.txt", "r1"):
        stored = any_service.store.get_document("notes", document_id)
        assert stored is not None and stored.metadata["source_root"] == str(folder), document_id
    for document_id in ("c.pdf", "old.md", "typed.md", "r9"):
        assert _content(any_service, document_id) == legacy[document_id][0], document_id
    # They are the folder's now: a file removed is deleted as any other.
    (folder / "sub" / "b.txt").unlink()
    report = _sync(any_service, folder)
    assert (_counts(report), report.documents_deleted) == ((0, 0, 2, 1, 1), 1)
    assert "sub/b.txt" not in _ids(any_service)


def test_an_older_releases_document_replaced_meanwhile_is_not_deleted(
    any_service: RagService, other: RagService, folder: Path
) -> None:
    _ingest_as_an_older_release(any_service, {"gone.md": ("Gnus migrate.", str(folder / "gone.md"))})
    typed = {"collection_id": "notes", "documents": [{"id": "gone.md", "content": "Typed by a client."}]}
    before_each_write(any_service, lambda: other.ingest(typed))
    report = _sync(any_service, folder)
    assert (_counts(report), report.documents_deleted) == ((4, 0, 0, 0, 0), 0)
    assert _content(any_service, "gone.md") == "Typed by a client."


def test_an_older_releases_relative_source_is_never_another_folders_file(
    any_service: RagService, folder: Path, tmp_path: Path
) -> None:
    """`iris-rag ingest .` stored `source` "y.md", which any folder's y.md ends with: the same text counts."""
    legacy: dict[str, tuple[str, str | None]] = {
        "x.md": ("Xylophones from folder A.", "x.md"),
        "y.md": ("Yaks from folder A.", "y.md"),
        "r1": ("Rivers of folder A.", "records.jsonl"),
        "sub/b.txt": ("Bats hunt by echolocation.", "b.txt"),  # this folder's, its text unchanged
    }
    _ingest_as_an_older_release(any_service, legacy)
    (folder / "y.md").write_text("Yodels of this folder.", encoding="utf-8")
    for dry_run in (True, False):
        report = _sync(any_service, folder, dry_run=dry_run)
        assert (_counts(report), report.documents_deleted) == ((3, 1, 0, 0, 2), 0), dry_run
        assert [(Path(e.location).name, e.message.split(";")[0]) for e in report.errors] == [
            ("records.jsonl", "document id 'r1' is already in 'notes', not read from a folder"),
            ("y.md", "document id 'y.md' is already in 'notes', not read from a folder"),
        ]
    for document_id in ("x.md", "y.md", "r1"):
        assert _content(any_service, document_id) == legacy[document_id][0], document_id
    stored = any_service.store.get_document("notes", "sub/b.txt")
    assert stored is not None and stored.metadata["source_root"] == str(folder)


def test_an_older_releases_relative_document_the_walk_misses_is_kept_with_a_note(
    any_service: RagService, folder: Path
) -> None:
    """A file reached through a linked folder is walked under its real path only: its old id is not gone."""
    (folder / "linked").symlink_to(folder / "sub", target_is_directory=True)
    _ingest_as_an_older_release(any_service, {"linked/b.txt": ("Bats hunt by echolocation.", "linked/b.txt")})
    report = _sync(any_service, folder)
    assert (_counts(report), report.documents_deleted) == ((4, 0, 0, 0, 0), 0)
    assert report.notes == [
        "1 document an older release stored with a relative source is kept: sync did not find it in this "
        "folder, and another folder may hold it; if gone, delete it: iris-rag delete --collection notes "
        "linked/b.txt"
    ]
    assert "linked/b.txt" in _ids(any_service)
