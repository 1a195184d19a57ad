"""Small real files of each format, written by the tests (no fixtures to keep in sync)."""

from __future__ import annotations

from pathlib import Path

import docx
from pypdf import PdfWriter
from pypdf.generic import ContentStream, DictionaryObject, NameObject


def write_pdf(path: Path, pages: list[str], *, title: str | None = None) -> Path:
    """A PDF whose pages each show one line of text in Helvetica (PDF string syntax: no parentheses)."""
    writer = PdfWriter()
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    for text in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        stream = ContentStream(None, writer)
        stream.set_data(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1"))
        page.replace_contents(stream)
    if title is not None:
        writer.add_metadata({"/Title": title})
    with path.open("wb") as handle:
        writer.write(handle)
    return path


def write_docx(path: Path, heading: str, paragraphs: list[str], table: list[list[str]] | None = None) -> Path:
    """A Word file: a Heading 1, paragraphs, and optionally a table."""
    document = docx.Document()
    document.add_heading(heading, level=1)
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    document.save(str(path))
    return path
