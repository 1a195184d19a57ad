"""`iris-rag sync`: a folder's new and changed files go in, removed ones come out, the rest is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from iris_rag import cli
from iris_rag.ingestion.sync import SyncReport, sync_folder
from iris_rag.service import RagService
from tests.ingestion.make_files import write_pdf


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
    assert capsys.readouterr().out.strip().endswith("4 added, 0 updated, 0 unchanged, 0 deleted, 0 errors")
    (folder / "bad.docx").write_bytes(b"not a docx")
    assert cli.main(["sync", str(folder), "--collection", "notes"]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip().endswith("4 added, 0 updated, 0 unchanged, 0 deleted, 1 errors")
    assert "bad.docx" in captured.err
