import os
from pathlib import Path

from iris_rag.ingestion.loaders import (
    CsvColumns,
    SourceDocument,
    SourceError,
    SourceFile,
    find_files,
    iter_source,
    read_file,
)
from tests.deadline import release_fifo, within


def test_folder_of_text_and_markdown(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Heading title\n\nBody text.", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Plain text.", encoding="utf-8")
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    items = list(iter_source(tmp_path))
    assert all(isinstance(i, SourceDocument) for i in items)
    docs = {i.id: i for i in items if isinstance(i, SourceDocument)}
    assert set(docs) == {"a.md", "sub/b.txt"}
    assert docs["a.md"].title == "Heading title"
    assert docs["sub/b.txt"].title == "b"


def test_non_utf8_file_is_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("Fine.", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes("caf\xe9".encode("latin-1"))
    items = list(iter_source(tmp_path))
    errors = [i for i in items if isinstance(i, SourceError)]
    assert len(errors) == 1
    assert "UTF-8" in errors[0].message
    assert [i.id for i in items if isinstance(i, SourceDocument)] == ["good.txt"]


def test_beir_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        '{"_id": "d1", "title": "T", "text": "Body.", "metadata": {"year": 2020}}\n'
        "not json\n"
        '{"_id": "d2", "title": "", "text": "Second."}\n',
        encoding="utf-8",
    )
    items = list(iter_source(path))
    docs = [i for i in items if isinstance(i, SourceDocument)]
    assert [d.id for d in docs] == ["d1", "d2"]
    assert docs[0].metadata["year"] == 2020
    assert isinstance(items[1], SourceError)


def test_csv_with_chosen_columns(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("key,body,heading,year\n1,First body.,One,2020\n2,,Two,2021\n", encoding="utf-8")
    items = list(iter_source(path, csv_columns=CsvColumns(text="body", id="key", title="heading")))
    docs = [i for i in items if isinstance(i, SourceDocument)]
    assert [(d.id, d.title, d.content, d.metadata["year"]) for d in docs] == [
        ("1", "One", "First body.", "2020")
    ]
    assert any(isinstance(i, SourceError) for i in items)
    missing = list(iter_source(path))
    assert isinstance(missing[0], SourceError)
    assert "--text-column" in missing[0].message


def test_csv_rows_over_several_lines_and_an_unclosed_quote(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('id,text\n1,"Two\nlines."\n2,"never closed\n3,Third.\n4,Fourth.\n', encoding="utf-8")
    items = list(iter_source(path))
    docs = [i for i in items if isinstance(i, SourceDocument)]
    assert [(d.id, d.content) for d in docs] == [("1", "Two\nlines.")]
    errors = [i for i in items if isinstance(i, SourceError)]
    assert [e.location for e in errors] == [f"{path}:4"]
    assert "quoted field is never closed" in errors[0].message


def test_a_fifo_is_reported_never_opened(tmp_path: Path) -> None:
    # Opening a named pipe for reading waits for a writer, forever: it must be skipped, in a folder or named.
    (tmp_path / "ok.txt").write_text("A note about photosynthesis.", encoding="utf-8")
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    items = within(10, lambda: list(iter_source(tmp_path)), unblock=release_fifo(pipe))
    assert [i.id for i in items if isinstance(i, SourceDocument)] == ["ok.txt"]
    assert [(e.location, e.message) for e in items if isinstance(e, SourceError)] == [
        (str(pipe), "not a regular file (a named pipe); skipped")
    ]
    named = within(10, lambda: list(iter_source(pipe)), unblock=release_fifo(pipe))
    assert named == [SourceError(str(pipe), "not a regular file (a named pipe); skipped")]


def test_a_file_that_became_a_fifo_after_the_walk_is_not_read(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe.txt"
    pipe.write_text("Text.", encoding="utf-8")
    [found] = find_files(pipe)
    assert isinstance(found, SourceFile)
    pipe.unlink()
    os.mkfifo(pipe)
    items = within(10, lambda: list(read_file(found)), unblock=release_fifo(pipe))
    assert items == [SourceError(str(pipe), "not a regular file (a named pipe); skipped")]
