"""Text out of HTML, PDF and Word files, each through its own well-kept parser.

The parsers are imported when a file of their kind is read, so that a worker that never reads one does not
pay for loading them.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

# A .docx is a zip archive: refuse one that would unpack to more than this rather than fill the memory.
MAX_DOCX_UNPACKED_BYTES = 256 * 1024 * 1024
_BLANK_RUNS = re.compile(r"\n\s*\n\s*")
_SPACES = re.compile(r"[ \t\r\f\v]+")


class FormatError(Exception):
    """A file that its format's parser cannot make sense of; the message says why."""


@dataclass(frozen=True)
class Extracted:
    """The text of a file and its title ("" when the file names none)."""

    title: str
    text: str


def _tidy(text: str) -> str:
    """Collapse runs of spaces and of blank lines, which extraction leaves in plenty."""
    lines = (_SPACES.sub(" ", line).strip() for line in text.splitlines())
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


def extract_html(data: bytes) -> Extracted:
    """The visible text of an HTML page (no script, style or template) and its <title>."""
    from bs4 import BeautifulSoup

    # html.parser ships with Python; bs4 detects the encoding from the bytes and the page's meta charset.
    soup = BeautifulSoup(data, "html.parser")
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    for element in soup(["script", "style", "noscript", "template", "title"]):
        element.decompose()
    return Extracted(title, _tidy(soup.get_text("\n")))


def extract_pdf(data: bytes) -> Extracted:
    """The text of every page of a PDF, pages apart by a blank line, and its document title."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            msg = "the PDF is encrypted with a password"
            raise FormatError(msg)
        pages = [page.extract_text() or "" for page in reader.pages]
        title = (reader.metadata.title if reader.metadata else None) or ""
    except PyPdfError as exc:
        msg = f"not a readable PDF: {exc}"
        raise FormatError(msg) from exc
    text = "\n\n".join(_tidy(page) for page in pages if page.strip())
    if not text:
        msg = "the PDF has no extractable text (a scanned PDF needs OCR first)"
        raise FormatError(msg)
    return Extracted(str(title).strip(), text)


def extract_docx(data: bytes) -> Extracted:
    """The paragraphs and table cells of a Word .docx file, in order, and its title."""
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile as exc:
        msg = "not a .docx file (not a zip archive)"
        raise FormatError(msg) from exc
    if unpacked > MAX_DOCX_UNPACKED_BYTES:
        msg = f"the .docx unpacks to {unpacked} bytes, over {MAX_DOCX_UNPACKED_BYTES}"
        raise FormatError(msg)
    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError) as exc:
        msg = f"not a readable .docx: {exc}"
        raise FormatError(msg) from exc
    blocks: list[str] = []
    title = document.core_properties.title or ""
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            blocks.extend(" | ".join(cell.text for cell in row.cells) for row in block.rows)
            continue
        if not title and block.style is not None and block.style.name in {"Title", "Heading 1"}:
            title = block.text
        blocks.append(block.text)
    return Extracted(title.strip(), _tidy("\n".join(blocks)))


EXTRACTORS: dict[str, Callable[[bytes], Extracted]] = {
    ".html": extract_html,
    ".htm": extract_html,
    ".pdf": extract_pdf,
    ".docx": extract_docx,
}
