"""Text out of HTML, PDF and Word files, each through its own well-kept parser.

The parsers are imported when a file of their kind is read, so that a worker that never reads one does not
pay for loading them.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bs4.element import Tag

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
    """The visible text of an HTML page and its <title>, laid out as a browser would.

    Inline markup (<a>, <code>, <em>...) flows within its sentence; block elements (paragraphs, headings,
    list items, table rows...) are apart by a blank line, which ends a sentence; a table row's cells are
    joined by " | " as in a .docx; <br> is a line break. Script, style, template and the fallback content
    of embedded things (iframe, textarea, svg, canvas, object...) are dropped.
    """
    from bs4 import BeautifulSoup

    # html.parser ships with Python; bs4 detects the encoding from the bytes and the page's meta charset.
    soup = BeautifulSoup(data, "html.parser")
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    return Extracted(title, _tidy("".join(_html_text(soup))))


# Elements whose content a reader does not see as text of the page.
_HTML_DROPPED = frozenset(
    "script style noscript template title iframe textarea svg canvas object embed noembed noframes "
    "audio video datalist".split()
)
# Elements a browser lays out as blocks (display: block, list-item, table...): each ends a sentence.
_HTML_BLOCKS = frozenset(
    "address article aside blockquote body caption center dd details dialog dir div dl dt fieldset "
    "figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 header hgroup hr html legend li listing "
    "main menu nav ol optgroup option p plaintext pre search section summary table tbody tfoot thead "
    "tr ul xmp".split()
)
_HTML_CELLS = frozenset({"td", "th"})
# A row of cells: a <tr>, or a <table> itself for cells written without one (a browser implies the row).
_HTML_ROWS = frozenset({"tr", "table"})
_HTML_PREFORMATTED = frozenset({"pre", "listing", "plaintext", "xmp"})
# HTML's whitespace: a run of it between words shows as one space (a no-break space is not one).
_HTML_WHITESPACE = re.compile(r"[ \t\n\r\f]+")
_BLOCK_BREAK = "\n\n"
# Markers the walk of a page leaves on its stack, met again when the element they close has been walked.
_ROW_END = object()
_PRE_END = object()


def _html_text(soup: Tag) -> Iterator[str]:
    """The pieces of a parsed page's text, in order, with the breaks its layout puts between them."""
    from bs4.element import CData, NavigableString, Tag

    # An explicit stack rather than recursion: a page may nest elements deeper than Python recurses.
    # An entry is a node to visit, a break to emit, or a marker for the end of a table row or a <pre>.
    stack: list[object] = [soup]
    preformatted = 0  # how many <pre> the walk is inside (each _PRE_END on the stack closes one)
    cells: list[int] = []  # per open row (innermost last), how many cells it has had so far
    while stack:
        node = stack.pop()
        if isinstance(node, Tag):
            name = node.name
            if name in _HTML_DROPPED:
                continue
            if name == "br":
                yield "\n"
                continue
            closing: list[object] = []
            if name in _HTML_BLOCKS:
                yield _BLOCK_BREAK
                closing.append(_BLOCK_BREAK)
            if name in _HTML_ROWS:
                cells.append(0)
                closing.append(_ROW_END)
            elif name in _HTML_CELLS and cells:
                if cells[-1]:
                    yield " | "
                cells[-1] += 1
            if name in _HTML_PREFORMATTED:
                preformatted += 1
                closing.append(_PRE_END)
            stack.extend(closing)
            stack.extend(reversed(node.contents))
        elif node is _ROW_END:
            cells.pop()
        elif node is _PRE_END:
            preformatted -= 1
        elif type(node) in (NavigableString, CData):  # not comments, doctypes or <rt> ruby text
            text = str(node)
            yield text if preformatted else _HTML_WHITESPACE.sub(" ", text)
        elif type(node) is str:  # a break (a NavigableString is a str too, hence the exact type)
            yield node


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
    # A blank line between paragraphs (and table rows), as between HTML blocks and PDF pages: each ends
    # a sentence, so a heading or a list item is not run into the paragraph after it.
    return Extracted(title.strip(), _tidy(_BLOCK_BREAK.join(blocks)))


EXTRACTORS: dict[str, Callable[[bytes], Extracted]] = {
    ".html": extract_html,
    ".htm": extract_html,
    ".pdf": extract_pdf,
    ".docx": extract_docx,
}
