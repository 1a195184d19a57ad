from __future__ import annotations

import codecs
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from iris_rag.ingestion.loaders import (
    CsvColumns,
    SourceDocument,
    SourceError,
    SourceFile,
    UnreadableFolder,
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


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_csv_separated_otherwise_is_read_by_its_header(tmp_path: Path, delimiter: str) -> None:
    """A spreadsheet saved in a ';' locale, or a tab-separated export: the header says which."""
    path = tmp_path / "rows.csv"
    rows = [["id", "text", "price"], ["1", "A serval, a cat.", "3,50"], ["2", "A caracal.", "4,20"]]
    path.write_text("\n".join(delimiter.join(r) for r in rows) + "\n", encoding="utf-8")
    docs = [i for i in iter_source(path, csv_columns=CsvColumns(id="id")) if isinstance(i, SourceDocument)]
    assert [(d.id, d.content, d.metadata["price"]) for d in docs] == [
        ("1", "A serval, a cat.", "3,50"),
        ("2", "A caracal.", "4,20"),
    ]


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


def unreadable(folder: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Make a folder impossible to list: chmod 0 when not root; as root (who reads anything) os.scandir
    refuses it. The real mechanism as root, dropping the capabilities, is tested in a subprocess below.
    """
    if os.geteuid() != 0:
        folder.chmod(0)
        request.addfinalizer(lambda: folder.chmod(0o755))  # so that pytest can remove it
        return
    target = os.path.realpath(folder)
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if isinstance(path, str | os.PathLike) and os.path.realpath(os.fspath(path)) == target:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_jsonl_lines_are_split_on_newline_only(tmp_path: Path) -> None:
    # U+2028, U+2029 and U+0085 are legal unescaped in a JSON string; str.splitlines() broke lines at them.
    path = tmp_path / "corpus.jsonl"
    records = [
        {"_id": "r1", "text": "Para one\u2028para two about the walrus."},
        {"_id": "r2", "text": "Next line\u0085about the xerus\u2029."},
        {"_id": "r3", "text": "Plain record about the yak."},
    ]
    lines = [orjson.dumps(record).decode() for record in records]
    path.write_bytes(("\r\n".join(lines[:2]) + "\n" + lines[2] + "\nnot json\n").encode())
    items = list(iter_source(path))
    docs = [i for i in items if isinstance(i, SourceDocument)]
    assert [(d.id, d.content) for d in docs] == [(r["_id"], r["text"]) for r in records]
    assert [e.location for e in items if isinstance(e, SourceError)] == [f"{path}:4"]


@pytest.mark.parametrize(
    ("bom", "encoding"),
    [
        (codecs.BOM_UTF16_LE, "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be"),
        (codecs.BOM_UTF32_LE, "utf-32-le"),
        (codecs.BOM_UTF32_BE, "utf-32-be"),
    ],
)
def test_utf16_and_utf32_files_are_decoded_by_their_bom(tmp_path: Path, bom: bytes, encoding: str) -> None:
    # Windows PowerShell's `>` and Notepad's "Unicode" write UTF-16 LE with a BOM.
    (tmp_path / "ps.txt").write_bytes(bom + "Report from PowerShell: café.".encode(encoding))
    (tmp_path / "rows.csv").write_bytes(bom + "id,text\n1,Row one.\n".encode(encoding))
    (tmp_path / "lines.jsonl").write_bytes(bom + '{"_id": "j1", "text": "Line one."}\n'.encode(encoding))
    items = list(iter_source(tmp_path))
    assert [(i.id, i.content) for i in items if isinstance(i, SourceDocument)] == [
        ("j1", "Line one."),
        ("ps.txt", "Report from PowerShell: café."),
        ("1", "Row one."),
    ]


def test_a_broken_utf16_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "odd.txt").write_bytes(codecs.BOM_UTF16_LE + b"A\x00B")  # an odd number of bytes
    [error] = iter_source(tmp_path / "odd.txt")
    assert isinstance(error, SourceError)
    assert "not valid UTF-16" in error.message


def test_a_file_name_that_is_not_utf8_is_reported_and_the_rest_read(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("A good file about the ocelot.", encoding="utf-8")
    with open(os.fsencode(tmp_path) + b"/caf\xe9.txt", "wb") as handle:
        handle.write(b"A Latin-1 named file about the quetzal.\n")
    (tmp_path / "sub\udcff").mkdir()  # a folder name that is not UTF-8 either
    (tmp_path / "sub\udcff" / "inner.txt").write_text("Inside.", encoding="utf-8")
    items = list(iter_source(tmp_path))
    assert [i.id for i in items if isinstance(i, SourceDocument)] == ["good.txt"]
    errors = [i for i in items if isinstance(i, SourceError)]
    assert [(e.location, e.message) for e in errors] == [
        (f"{tmp_path}/caf\\xe9.txt", "file name is not valid UTF-8; rename it"),
        (f"{tmp_path}/sub\\xff/inner.txt", "file name is not valid UTF-8; rename it"),
    ]
    for error in errors:  # printable and storable as they are
        error.location.encode("utf-8")
    named = list(iter_source(Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.txt"))))
    assert [type(i) for i in named] == [SourceError]


def test_an_unreadable_folder_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "open.txt").write_text("Open file about the oribi.", encoding="utf-8")
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "notes.txt").write_text("Team notes about the puku.", encoding="utf-8")
    unreadable(tmp_path / "team", monkeypatch, request)
    items = list(find_files(tmp_path))
    assert [i.relative for i in items if isinstance(i, SourceFile)] == ["open.txt"]
    errors = [i for i in items if isinstance(i, SourceError)]
    assert [(e.location, e.message) for e in errors] == [
        (str(tmp_path / "team"), "cannot read this folder (Permission denied); the files in it were skipped")
    ]
    assert isinstance(errors[0], UnreadableFolder) and errors[0].path == tmp_path / "team"


def test_hidden_files_and_folders_are_left_out_of_a_walk_but_read_when_named(tmp_path: Path) -> None:
    (tmp_path / "seen.md").write_text("Seen, about the kob.", encoding="utf-8")
    (tmp_path / ".hidden.md").write_text("Hidden, about the lechwe.", encoding="utf-8")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "notes.txt").write_text("Version control, about the sitatunga.", encoding="utf-8")
    found = [i.relative for i in find_files(tmp_path) if isinstance(i, SourceFile)]
    assert found == ["seen.md"]
    named = [i.relative for i in find_files(tmp_path / ".hidden.md") if isinstance(i, SourceFile)]
    assert named == [".hidden.md"]
    walked = [i.relative for i in find_files(tmp_path / ".git") if isinstance(i, SourceFile)]
    assert walked == ["notes.txt"]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs as root with setpriv only (without root, the test above uses a real chmod 0)",
)
def test_an_unreadable_folder_is_reported_as_root_without_its_capabilities(tmp_path: Path) -> None:
    (tmp_path / "open.txt").write_text("Open file about the oribi.", encoding="utf-8")
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "notes.txt").write_text("Team notes about the puku.", encoding="utf-8")
    (tmp_path / "team").chmod(0)  # root reads it anyway; the subprocess below cannot
    script = (
        "import sys; from pathlib import Path; from iris_rag.ingestion.loaders import find_files\n"
        "for item in find_files(Path(sys.argv[1])): print(type(item).__name__, getattr(item, 'message', ''))"
    )
    caps = "-dac_override,-dac_read_search"
    command = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", "--"]
    command += [sys.executable, "-c", script, str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 and "setpriv" in done.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {done.stderr.strip()}")
    assert done.stdout.splitlines() == [
        "SourceFile ",
        "UnreadableFolder cannot read this folder (Permission denied); the files in it were skipped",
    ]


def test_a_symlinked_folder_is_reported_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "shared.txt").write_text("Shared note about the serval.", encoding="utf-8")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "local.txt").write_text("Local note.", encoding="utf-8")
    (tmp_path / "b" / "shared").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "b" / "linked.txt").symlink_to(tmp_path / "real" / "shared.txt")  # a file link is read
    (tmp_path / "b" / "sub").mkdir()
    (tmp_path / "b" / "sub" / "inner.txt").write_text("Inner note.", encoding="utf-8")
    # A link into the walked folder misses nothing: its files are read under their real path, silently.
    (tmp_path / "b" / "again").symlink_to(tmp_path / "b" / "sub", target_is_directory=True)
    items = list(find_files(tmp_path / "b"))
    assert [i.relative for i in items if isinstance(i, SourceFile)] == [
        "linked.txt",
        "local.txt",
        "sub/inner.txt",
    ]
    assert [(e.location, e.message) for e in items if isinstance(e, SourceError)] == [
        (
            str(tmp_path / "b" / "shared"),
            "a symlink to a folder outside this one; not followed (name that folder itself)",
        )
    ]


def test_markdown_front_matter_gives_the_title_and_metadata(tmp_path: Path) -> None:
    """Jekyll, Hugo and Obsidian notes start with YAML front matter: it was indexed as text, named by file."""
    path = tmp_path / "2024-01-05-q1.md"
    path.write_text(
        "---\ntitle: Quarterly review\ntags: [finance, q1]\ndate: 2024-01-05\ndraft: false\n"
        "author:\n  name: Ann\n---\n# Heading\n\nRevenue rose.\n",
        encoding="utf-8",
    )
    [document] = list(iter_source(path))
    assert isinstance(document, SourceDocument)
    assert (document.title, document.content) == ("Quarterly review", "# Heading\n\nRevenue rose.\n")
    assert {k: document.metadata[k] for k in ("tags", "date", "draft")} == {
        "tags": ["finance", "q1"],
        "date": "2024-01-05",
        "draft": False,
    }
    assert "author" not in document.metadata  # a mapping: no metadata value to filter on
    untitled = tmp_path / "note.md"
    untitled.write_text("---\ntags: [x]\n---\n# From the heading\n\nText.\n", encoding="utf-8")
    [note] = list(iter_source(untitled))
    assert isinstance(note, SourceDocument) and note.title == "From the heading"
    rule = tmp_path / "rule.md"  # a horizontal rule first, no YAML mapping: all of it is text
    rule.write_text("---\nJust a line.\n---\nMore.\n", encoding="utf-8")
    [plain] = list(iter_source(rule))
    assert isinstance(plain, SourceDocument) and plain.content.startswith("---\nJust a line.")
    text = tmp_path / "plain.txt"  # only Markdown has front matter
    text.write_text("---\ntitle: no\n---\nBody.\n", encoding="utf-8")
    [kept] = list(iter_source(text))
    assert isinstance(kept, SourceDocument) and kept.title == "plain" and kept.content.startswith("---")


def test_markdown_html_comments_are_left_out_but_not_in_code(tmp_path: Path) -> None:
    """`<!-- ... -->` is invisible once rendered (licence headers, TODOs): it was stored, quoted as text."""
    path = tmp_path / "guide.md"
    path.write_text(
        "<!--\nCopyright 2024 Example Corp.\n\nLicensed under the Apache License.\n-->\n"
        "# Install\n\nRun the installer.\n<!-- TODO: mention the proxy settings -->\n\n"
        "Then restart. <!-- editor: keep --> It is ready.\n\n"
        "```html\n<!-- a comment in a fence is code -->\n```\n\n"
        "    <!-- indented code -->\n\n"
        "Write `<!-- inline code -->` to hide a line.\n",
        encoding="utf-8",
    )
    [document] = list(iter_source(path))
    assert isinstance(document, SourceDocument)
    for hidden in ("Copyright", "Apache", "TODO", "proxy", "editor"):
        assert hidden not in document.content
    assert document.title == "Install"  # the first line once the licence header is gone
    assert "Run the installer." in document.content and "It is ready." in document.content
    assert "<!-- a comment in a fence is code -->" in document.content
    assert "`<!-- inline code -->`" in document.content
    assert "    <!-- indented code -->" in document.content


def test_a_markdown_comment_goes_where_it_is_not_where_its_text_is_quoted_first(tmp_path: Path) -> None:
    """The same `<!-- x -->` in a code span or escaped before the comment: the comment goes, they stay."""
    (tmp_path / "span.md").write_text("Use `<!-- x -->` to hide text, like this <!-- x --> here.\n")
    (tmp_path / "escaped.md").write_text("\\<!-- x --> shows, <!-- x --> hides.\n")
    (tmp_path / "both.md").write_text("``a `<!-- x -->` b`` and \\<!-- x -->: <!-- x -->gone <!-- x -->.\n")
    (tmp_path / "two.md").write_text("A <!-- a --> b `<!-- b -->` <!-- b --> c.\n")
    docs = {d.id: d.content for d in iter_source(tmp_path) if isinstance(d, SourceDocument)}
    assert docs == {
        "two.md": "A  b `<!-- b -->`  c.\n",
        "span.md": "Use `<!-- x -->` to hide text, like this  here.\n",
        "escaped.md": "\\<!-- x --> shows,  hides.\n",
        "both.md": "``a `<!-- x -->` b`` and \\<!-- x -->: gone .\n",
    }


def test_comment_text_in_a_link_title_or_a_tag_attribute_is_no_comment(tmp_path: Path) -> None:
    """It is the title's or the attribute's text: the comment after it goes, it stays."""
    (tmp_path / "link.md").write_text('[a](/u "<!-- x -->") and <!-- x --> end\n')
    (tmp_path / "tag.md").write_text('<span title="<!-- y -->">s</span> <!-- y --> end\n')
    # A destination with parentheses inside: which `<!-- z -->` is the comment is not told, so both stay.
    (tmp_path / "unsure.md").write_text('[a](/u(1) "<!-- z -->") and <!-- z --> end\n')
    docs = {d.id: d.content for d in iter_source(tmp_path) if isinstance(d, SourceDocument)}
    assert docs == {
        "link.md": '[a](/u "<!-- x -->") and  end\n',
        "tag.md": '<span title="<!-- y -->">s</span>  end\n',
        "unsure.md": '[a](/u(1) "<!-- z -->") and <!-- z --> end\n',
    }


def test_markdown_comment_left_open_and_txt_files_are_kept_as_they_are(tmp_path: Path) -> None:
    """A `<!--` never closed is kept: dropping the rest of the file for one typo would lose its text."""
    unclosed = tmp_path / "open.md"
    unclosed.write_text("Intro. <!-- a note\n\nThe rest of the file.\n", encoding="utf-8")
    plain = tmp_path / "notes.txt"  # only Markdown renders comments away
    plain.write_text("Keep <!-- this --> text.\n", encoding="utf-8")
    escaped = tmp_path / "escaped.md"
    escaped.write_text("Type \\<!-- to start one -->.\n", encoding="utf-8")
    docs = {d.id: d.content for d in iter_source(tmp_path) if isinstance(d, SourceDocument)}
    assert docs == {
        "open.md": "Intro. <!-- a note\n\nThe rest of the file.\n",
        "notes.txt": "Keep <!-- this --> text.\n",
        "escaped.md": "Type \\<!-- to start one -->.\n",
    }
