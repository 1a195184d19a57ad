"""rag_ingest with `paths`: files read in the worker under RAG_INGEST_ROOTS, on every store backend."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.access import Principal, principal_scope
from iris_rag.embedder import Embedder
from iris_rag.errors import ForbiddenError, InvalidParametersError
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import raise_unwritable_store
from tests.deadline import release_fifo, within
from tests.ingestion.make_files import write_docx, write_pdf
from tests.ingestion.test_loaders import unreadable


@pytest.fixture(autouse=True)
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A root folder with one file of each format; RAG_INGEST_ROOTS names it (set before the service)."""
    root = tmp_path / "docs"
    (root / "papers").mkdir(parents=True)
    (root / "notes.md").write_text(
        "# Tides\n\nThe moon's pull raises the tides twice a day.", encoding="utf-8"
    )
    (root / "page.html").write_text(
        "<html><head><title>Bees</title><script>x()</script></head>"
        "<body><p>Honey bees dance to show where flowers are.</p></body></html>",
        encoding="utf-8",
    )
    write_pdf(root / "papers" / "ice.pdf", ["Glaciers carve U-shaped valleys as they flow."], title="Ice")
    write_docx(root / "papers" / "bread.docx", "Bread", ["Sourdough rises because wild yeast ferments it."])
    (root / "faq.csv").write_text("id,title,text\nq1,Rust,Iron rusts when water and oxygen meet.\n", "utf-8")
    (root / "corpus.jsonl").write_text(
        '{"_id": "c1", "title": "Owls", "text": "Owls hunt at night."}\n', "utf-8"
    )
    monkeypatch.setenv("RAG_INGEST_ROOTS", str(root))
    return root


def test_a_folder_of_every_format_is_ingested_and_searchable(any_service: RagService, docs: Path) -> None:
    result = any_service.ingest({"collection_id": "files", "paths": [str(docs)]})
    assert result["errors"] == []
    assert sorted(result["document_ids"]) == [
        "c1",
        "notes.md",
        "page.html",
        "papers/bread.docx",
        "papers/ice.pdf",
        "q1",
    ]
    answer = any_service.execute(
        {
            "technique": "basic",
            "arguments": {"query": "How do glaciers shape valleys?", "collection_id": "files"},
        }
    )
    assert answer["retrieved_documents"][0]["id"] == "papers/ice.pdf"
    stored = any_service.get_document({"collection_id": "files", "document_id": "papers/ice.pdf"})
    assert stored["title"] == "Ice"
    assert stored["metadata"]["source_path"] == "papers/ice.pdf"
    assert len(stored["metadata"]["sha256"]) == 64


def test_ingesting_a_changed_file_again_replaces_its_document(any_service: RagService, docs: Path) -> None:
    note = docs / "notes.md"
    any_service.ingest({"collection_id": "files", "paths": [str(note)]})
    note.write_text("# Tides\n\nSpring tides come at full and new moon.", encoding="utf-8")
    result = any_service.ingest({"collection_id": "files", "paths": [str(note)]})
    assert result["document_ids"] == ["notes.md"]
    listing = any_service.list_documents({"collection_id": "files"})
    assert [d["id"] for d in listing["documents"]] == ["notes.md"]
    stored = any_service.get_document({"collection_id": "files", "document_id": "notes.md"})
    assert "Spring tides" in stored["content"]


def test_front_matter_tags_are_filtered_on_by_each_tag(any_service: RagService, docs: Path) -> None:
    """README: front matter's lists are metadata "to filter on"; {"tags": "antelope"} matched no note tagged
    [antelope, africa] (equality compared the whole list), and neither did an `in` of the tag."""
    notes = docs / "zoo"
    notes.mkdir()
    for name, tags in [("kudu", "[antelope, africa]"), ("lion", "[cat, africa]"), ("eland", "antelope")]:
        front = f"---\ntitle: The {name}\ntags: {tags}\ndate: 2021-05-01\n---\n"
        (notes / f"{name}.md").write_text(f"{front}The {name} is an animal of the savanna.\n", "utf-8")
    assert any_service.ingest({"collection_id": "zoo", "paths": [str(notes)]})["errors"] == []

    def found(technique: str, filters: dict[str, Any]) -> set[str]:
        arguments = {"query": "savanna animal", "collection_id": "zoo", "options": {"filters": filters}}
        result = any_service.execute({"technique": technique, "arguments": arguments})
        return {d["id"] for d in result["retrieved_documents"]}

    for technique in ("basic", "hybrid_ifind"):
        assert found(technique, {"date": {"gte": "2021-01-01"}}) == {
            "zoo/kudu.md",
            "zoo/lion.md",
            "zoo/eland.md",
        }
        assert found(technique, {"tags": "antelope"}) == {"zoo/kudu.md", "zoo/eland.md"}, technique
        assert found(technique, {"tags": {"in": ["cat"]}}) == {"zoo/lion.md"}, technique
        assert found(technique, {"tags": "africa", "date": "2021-05-01"}) == {"zoo/kudu.md", "zoo/lion.md"}
    deleted = any_service.delete_documents({"collection_id": "zoo", "filter": {"tags": "cat"}})
    assert deleted["deleted_ids"] == ["zoo/lion.md"]


def test_file_errors_name_the_path_they_came_from(any_service: RagService, docs: Path) -> None:
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7\nnot a pdf at all")
    (docs / "blank.txt").write_text("   \n", encoding="utf-8")
    paths = [str(docs / "notes.md"), str(docs / "broken.pdf"), str(docs / "blank.txt")]
    result = any_service.ingest({"collection_id": "files", "paths": paths})
    assert result["document_ids"] == ["notes.md"]
    errors = [(e["index"], e["code"], e["message"]) for e in result["errors"]]
    assert [(index, code) for index, code, _ in errors] == [(1, "UNREADABLE_FILE"), (2, "INVALID_DOCUMENT")]
    assert "broken.pdf" in errors[0][2]
    assert errors[1][2].startswith("blank.txt: ")


def test_a_path_outside_the_roots_refuses_the_whole_call(any_service: RagService, docs: Path) -> None:
    outside = docs.parent / "elsewhere.txt"
    outside.write_text("Not for clients.", encoding="utf-8")
    for path in [outside, docs / ".." / "elsewhere.txt"]:
        with pytest.raises(InvalidParametersError, match="outside RAG_INGEST_ROOTS"):
            any_service.ingest({"collection_id": "files", "paths": [str(docs / "notes.md"), str(path)]})
    assert any_service.list_collections({})["collections"] == []


def test_an_ingest_that_stores_nothing_leaves_no_new_collection(
    any_service: RagService, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused or failed rag_ingest naming a new collection leaves none behind, listed and empty."""
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7\nnot a pdf at all")
    (docs / "blank.txt").write_text("   \n", encoding="utf-8")
    reader = Principal("reader", frozenset({"read"}), None)
    calls: list[tuple[dict[str, Any], Principal | None]] = [
        ({"paths": [str(docs / "missing.md")]}, None),
        ({"paths": [str(docs / "broken.pdf"), str(docs / "blank.txt")]}, None),
        ({"paths": [str(docs / "notes.md")]}, reader),
        ({"documents": [{"content": "  "}, {"id": "", "content": "No id."}]}, None),
    ]
    for arguments, principal in calls:
        with principal_scope(principal):
            try:
                result = any_service.ingest({"collection_id": "new", **arguments})
            except (InvalidParametersError, ForbiddenError):
                pass
            else:
                assert result["ingested_count"] == 0 and result["errors"], result
        assert any_service.list_collections({})["collections"] == [], arguments

    # A failure inside the commit (a technique index's write) rolls the new collection back with it.
    views = any_service.pipelines["sqlrag"].technique_index()
    assert views is not None
    monkeypatch.setattr(views, "write", lambda *_: raise_unwritable_store())
    with pytest.raises(sqlite3.Error):
        any_service.ingest({"collection_id": "new", "paths": [str(docs / "notes.md")]})
    assert any_service.list_collections({})["collections"] == []


def test_exactly_one_of_documents_and_paths(any_service: RagService, docs: Path) -> None:
    both = {"collection_id": "files", "paths": [str(docs)], "documents": [{"content": "Text."}]}
    cases: list[dict[str, Any]] = [both, {"collection_id": "files"}]
    for arguments in cases:
        with pytest.raises(InvalidParametersError, match="either documents or paths"):
            any_service.ingest(arguments)
    for bad in [[], [""], ["x"] * 101]:
        with pytest.raises(InvalidParametersError, match="/paths"):
            any_service.ingest({"collection_id": "files", "paths": bad})


def test_a_caller_without_write_access_reads_no_file(any_service: RagService, docs: Path) -> None:
    reader = Principal("reader", frozenset({"read"}), None)
    with principal_scope(reader), pytest.raises(ForbiddenError):
        any_service.ingest({"collection_id": "files", "paths": [str(docs)]})


@pytest.fixture
def configured(tmp_path: Path, embedder: Embedder) -> Iterator[Callable[..., RagService]]:
    """A factory of services on SQLite with RAG_INGEST_ROOTS and RAG_INGEST_MAX_BYTES as given."""
    made: list[RagService] = []

    def build(**settings: Any) -> RagService:
        made.append(RagService(Settings(RAG_DATA_DIR=tmp_path / "data", **settings), embedder=embedder))
        return made[-1]

    yield build
    for service in made:
        service.close()


def test_unset_roots_disable_paths_and_name_the_variable(
    configured: Callable[..., RagService], docs: Path
) -> None:
    service = configured(RAG_INGEST_ROOTS="")
    with pytest.raises(InvalidParametersError, match="RAG_INGEST_ROOTS is not set"):
        service.ingest({"collection_id": "files", "paths": [str(docs / "notes.md")]})


def test_the_byte_cap_comes_from_the_setting(configured: Callable[..., RagService], docs: Path) -> None:
    service = configured(RAG_INGEST_ROOTS=str(docs), RAG_INGEST_MAX_BYTES=100)
    with pytest.raises(InvalidParametersError, match="RAG_INGEST_MAX_BYTES"):
        service.ingest({"collection_id": "files", "paths": [str(docs)]})


def test_a_fifo_in_a_folder_or_named_is_reported_not_read(
    configured: Callable[..., RagService], docs: Path
) -> None:
    # Reading one would wait for a writer forever, holding a worker thread that cancelling cannot free.
    service = configured(RAG_INGEST_ROOTS=str(docs))
    pipe = docs / "pipe.txt"
    os.mkfifo(pipe)
    arguments = {"collection_id": "files", "paths": [str(docs), str(pipe)]}
    result = within(30, lambda: service.ingest(arguments), unblock=release_fifo(pipe))
    assert "notes.md" in result["document_ids"]
    assert [(e["index"], e["code"], e["message"]) for e in result["errors"]] == [
        (position, "UNREADABLE_FILE", f"{pipe}: not a regular file (a named pipe); skipped")
        for position in (0, 1)
    ]


def test_a_file_name_that_is_not_utf8_is_reported_and_the_rest_ingested(
    any_service: RagService, docs: Path
) -> None:
    with open(os.fsencode(docs) + b"/caf\xe9.txt", "wb") as handle:
        handle.write(b"A Latin-1 named file about the quetzal.\n")
    result = any_service.ingest({"collection_id": "files", "paths": [str(docs)]})
    assert len(result["document_ids"]) == 6
    assert [(e["index"], e["code"], e["message"]) for e in result["errors"]] == [
        (0, "UNREADABLE_FILE", f"{docs}/caf\\xe9.txt: file name is not valid UTF-8; rename it")
    ]


def test_an_unreadable_folder_is_reported(
    any_service: RagService, docs: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    unreadable(docs / "papers", monkeypatch, request)
    result = any_service.ingest({"collection_id": "files", "paths": [str(docs)]})
    assert sorted(result["document_ids"]) == ["c1", "notes.md", "page.html", "q1"]
    message = f"{docs / 'papers'}: cannot read this folder (Permission denied); the files in it were skipped"
    assert [(e["index"], e["code"], e["message"]) for e in result["errors"]] == [
        (0, "UNREADABLE_FILE", message)
    ]
    # Named itself: the same error, and no NO_FILES beside it (it may hold files; they could not be listed).
    result = any_service.ingest({"collection_id": "files", "paths": [str(docs / "papers")]})
    assert [(e["code"], e["message"]) for e in result["errors"]] == [("UNREADABLE_FILE", message)]
