"""Each file format read from a real file: its text, its title, and where it came from."""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path

import docx

from iris_rag.ingestion.formats import extract_docx, extract_html
from iris_rag.ingestion.loaders import SourceDocument, SourceError, iter_source
from iris_rag.text import split_sentences
from tests.ingestion.make_files import write_docx, write_pdf

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Glacier   facts</title>
<style>p { color: red }</style><script>var secret = "not text";</script></head>
<body><h1>Glaciers</h1><p>Glaciers move   downhill under their own weight.</p>
<noscript>enable scripts</noscript><p>Caf\u00e9 au lait.</p></body></html>"""


def _documents(path: Path) -> dict[str, SourceDocument]:
    items = list(iter_source(path))
    assert not [i for i in items if isinstance(i, SourceError)], items
    return {i.id: i for i in items if isinstance(i, SourceDocument) and i.id is not None}


def test_html_keeps_title_and_visible_text_only(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text(PAGE, encoding="utf-8")
    document = _documents(tmp_path)["page.html"]
    assert document.title == "Glacier facts"
    assert (
        document.content == "Glaciers\n\nGlaciers move downhill under their own weight.\n\nCaf\u00e9 au lait."
    )
    assert "secret" not in document.content and "color" not in document.content
    assert "enable scripts" not in document.content


def _sentences(text: str) -> list[str]:
    return [span.text for span in split_sentences(text)]


def test_html_inline_tags_flow_within_their_sentence() -> None:
    page = b"""<html><head><title>Git guide</title></head><body>
<p>To save your work run <code>git</code> <code>commit</code> with a message describing the change.</p>
<p>Glaciers carve <a href="/valley">U-shaped valleys</a>
as they flow <em>slowly</em> down<b>hill</b> over <span>many</span>&nbsp;centuries.</p>
<p>Water is H<sub>2</sub>O; press <kbd>Ctrl</kbd>+<kbd>C</kbd> to <i>copy</i>.</p></body></html>"""
    extracted = extract_html(page)
    assert extracted.title == "Git guide"
    assert _sentences(extracted.text) == [
        "To save your work run git commit with a message describing the change.",
        "Glaciers carve U-shaped valleys as they flow slowly downhill over many\u00a0centuries.",
        "Water is H2O; press Ctrl+C to copy.",
    ]


def test_html_blocks_end_sentences_and_embedded_fallbacks_are_dropped() -> None:
    page = b"""<body><h2>Setup</h2><ul><li>Install Python</li><li>Install Node</li></ul>
<div>First line<br>second line</div>
<table><tr><th>region</th><th>sales</th></tr><tr><td>north</td><td>12</td></tr></table>
<pre>def f():
    return  1</pre>
<iframe src="x">Your browser has no frames</iframe><textarea>typed text</textarea>
<svg><text>chart label</text></svg><canvas>no canvas</canvas><object>no plugin</object>
<video>no video</video><blockquote>Quoted</blockquote><!-- a comment --><footer>Footer text</footer></body>"""
    assert extract_html(page).text == (
        "Setup\n\nInstall Python\n\nInstall Node\n\nFirst line\nsecond line\n\n"
        "region | sales\n\nnorth | 12\n\ndef f():\nreturn 1\n\nQuoted\n\nFooter text"
    )


def test_pdf_pages_and_title(tmp_path: Path) -> None:
    write_pdf(
        tmp_path / "ice.pdf",
        ["Ice sheets hold most fresh water.", "Sea level rises as they melt."],
        title="Ice",
    )
    document = _documents(tmp_path)["ice.pdf"]
    assert document.title == "Ice"
    assert document.content == "Ice sheets hold most fresh water.\n\nSea level rises as they melt."


def test_pdf_without_a_title_is_named_after_its_file(tmp_path: Path) -> None:
    write_pdf(tmp_path / "notes.pdf", ["Only text."])
    assert _documents(tmp_path)["notes.pdf"].title == "notes"


def test_docx_paragraphs_tables_and_heading_title(tmp_path: Path) -> None:
    write_docx(
        tmp_path / "report.docx",
        "Quarterly report",
        ["Sales rose by a tenth.", "Costs stayed flat."],
        table=[["region", "sales"], ["north", "12"]],
    )
    document = _documents(tmp_path)["report.docx"]
    assert document.title == "Quarterly report"
    assert document.content == (
        "Quarterly report\n\nSales rose by a tenth.\n\nCosts stayed flat.\n\nregion | sales\n\nnorth | 12"
    )


def test_docx_paragraphs_are_separate_sentences(tmp_path: Path) -> None:
    word = docx.Document()
    word.add_heading("Installation", level=1)
    word.add_paragraph("Python 3.11 or newer", style="List Bullet")
    word.add_paragraph("Node 20 or newer", style="List Bullet")
    word.add_paragraph("")
    word.add_paragraph("If the server does not start check the log file")
    word.add_paragraph("Restart the machine when the GPU driver was updated.")
    word.save(str(tmp_path / "manual.docx"))
    extracted = extract_docx((tmp_path / "manual.docx").read_bytes())
    assert extracted.title == "Installation"
    assert _sentences(extracted.text) == [
        "Installation",
        "Python 3.11 or newer",
        "Node 20 or newer",
        "If the server does not start check the log file",
        "Restart the machine when the GPU driver was updated.",
    ]


def test_every_file_document_says_where_it_came_from(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    note = tmp_path / "sub" / "note.md"
    note.write_text("# Note\n\nText.", encoding="utf-8")
    (tmp_path / "corpus.jsonl").write_text('{"_id": "r1", "text": "A record."}\n', encoding="utf-8")
    documents = _documents(tmp_path)
    metadata = documents["sub/note.md"].metadata
    assert metadata["source_path"] == "sub/note.md"
    assert metadata["source_root"] == str(tmp_path.resolve())
    assert metadata["sha256"] == hashlib.sha256(note.read_bytes()).hexdigest()
    assert datetime.fromisoformat(metadata["mtime"]).timestamp() == int(note.stat().st_mtime)
    # Records of a .jsonl keep their own ids and carry their file's provenance.
    assert documents["r1"].metadata["source_path"] == "corpus.jsonl"
    assert (
        documents["r1"].metadata["sha256"]
        == hashlib.sha256(b'{"_id": "r1", "text": "A record."}\n').hexdigest()
    )


def test_a_file_that_does_not_parse_is_an_error_and_the_rest_are_read(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nnot really a pdf")
    (tmp_path / "broken.docx").write_bytes(b"PK\x03\x04 not a zip either")
    (tmp_path / "fine.txt").write_text("Readable.", encoding="utf-8")
    items = list(iter_source(tmp_path))
    errors = {Path(i.location).name: i.message for i in items if isinstance(i, SourceError)}
    assert set(errors) == {"broken.pdf", "broken.docx"}
    assert "PDF" in errors["broken.pdf"] and "docx" in errors["broken.docx"]
    assert [i.id for i in items if isinstance(i, SourceDocument)] == ["fine.txt"]


def test_a_scanned_pdf_without_text_says_so(tmp_path: Path) -> None:
    write_pdf(tmp_path / "scan.pdf", [""])
    [error] = list(iter_source(tmp_path / "scan.pdf"))
    assert isinstance(error, SourceError) and "OCR" in error.message
