"""Source readers: text, markdown, HTML, PDF and Word files, BEIR-style JSON lines, CSV.

Each yields documents or errors; one file that cannot be read or parsed never stops the others.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from markdown_it import MarkdownIt

from iris_rag.ingestion.formats import EXTRACTORS, FormatError
from iris_rag.text import CsvProblem, csv_delimiter, csv_records, is_utf8

MARKDOWN_SUFFIXES = {".md", ".markdown"}
TEXT_SUFFIXES = {".txt", *MARKDOWN_SUFFIXES}
# YAML front matter: a "---" line first, then the YAML, then a "---" (or "...") line.
_FRONT_MATTER = re.compile(r"---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|$)", re.DOTALL)
# Markdown as CommonMark reads it: where its HTML comments are (and are not: code, code spans, escapes).
_MARKDOWN = MarkdownIt("commonmark")
_HTML_COMMENT = re.compile(r"<!--(?:-?>|[\s\S]*?-->)")  # CommonMark's: <!-->, <!---> and <!-- ... -->
# Where a paragraph's source could hold a comment, a code span or an escape (a backslash before punctuation),
# or text that is no comment though it may look like one: an HTML tag's attributes (CommonMark's open tag)
# and a link's destination and title.
_INLINE_MARKUP = re.compile(
    r"(?P<escape>\\[!-/:-@\[-`{-~])|(?P<ticks>`+)"
    r"|<[A-Za-z][A-Za-z0-9-]*(?:\s+[A-Za-z_:][\w.:-]*(?:\s*=\s*(?:[^\s\"'=<>`]+|'[^']*'|\"[^\"]*\"))?)*\s*/?>"
    r"|\]\(\s*(?:<[^<>\n]*>|[^\s()<>]*)(?:\s+(?:\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|\((?:\\.|[^()\\])*\)))?\s*\)"
    r"|<!--"
)
_LINE_ENDS = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | set(EXTRACTORS) | {".jsonl", ".csv"}
_ESCAPING_LINK = "a symlink that leads outside the allowed folders; skipped"
_LINKED_FOLDER = "a symlink to a folder outside this one; not followed (name that folder itself)"
_NOT_UTF8_NAME = "file name is not valid UTF-8; rename it"
# Text decoded by its byte order mark; UTF-32's come first (UTF-32 LE's begins with UTF-16 LE's).
_BOMS = [
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
]
# Opened without waiting: a FIFO that took a file's place after its check must not hold the reader.
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)


@dataclass(frozen=True)
class SourceDocument:
    """A document read from a file, before chunking."""

    id: str | None
    content: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceError:
    """A file or record that could not be read; reported, never fatal to the rest.

    `record`: the error is about one record that was read whole but is no document (a CSV row without
    text), so its file still parsed; `record_id` is that record's id when it has one.
    """

    location: str
    message: str
    record: bool = False
    record_id: str | None = None


@dataclass(frozen=True)
class UnreadableFolder(SourceError):
    """A folder the walk could not list: none of the files under it were seen (not that they are gone)."""

    path: Path = Path()


@dataclass(frozen=True)
class NoSupportedFiles(SourceError):
    """A folder that holds no file of a supported type (and none it could not list): rag_ingest's NO_FILES."""


def shown(path: Path | str) -> str:
    """A path as text that can be printed and stored: bytes of a name that are not UTF-8 as escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class CsvColumns:
    """Which CSV columns hold the text, the id and the title."""

    text: str = "text"
    id: str | None = "id"
    title: str | None = "title"


@dataclass(frozen=True)
class SourceFile:
    """A file found under a root folder; its path relative to the root is its documents' source_path."""

    path: Path
    root: Path
    size: int
    mtime: float

    @property
    def relative(self) -> str:
        """The path relative to the root, with forward slashes (a text file's document id)."""
        return self.path.relative_to(self.root).as_posix()


def iter_source(
    path: Path, *, csv_columns: CsvColumns | None = None, report_empty: bool = False
) -> Iterator[SourceDocument | SourceError]:
    """Read a file, or every supported file under a folder (sorted, so ids and order are stable).

    `report_empty`: as find_files.
    """
    for item in find_files(path, report_empty=report_empty):
        if isinstance(item, SourceError):
            yield item
        else:
            yield from read_file(item, csv_columns=csv_columns)


def find_files(
    path: Path,
    *,
    root: Path | None = None,
    confine: Callable[[Path], bool] | None = None,
    report_empty: bool = False,
) -> Iterator[SourceFile | SourceError]:
    """The supported files at path: the file itself, or those under the folder in path order, not hidden.

    `root` (default: the folder, or a file's own folder) is what source paths are relative to. `confine`,
    when given, says whether a resolved path may be read: a symlink leading elsewhere is reported, not
    read. Symlinked folders are never descended into, so a walk cannot loop. `report_empty`: a folder
    with no supported file (and none it could not list) ends with NoSupportedFiles, so that an ingest of
    only .doc files does not look like a success (sync leaves it out: an emptied folder is no error there).
    """
    if path.is_dir():
        base = root or path
        found: list[tuple[Path, SourceFile | SourceError]] = []
        walked = path.resolve()

        def unlisted(error: OSError) -> None:
            folder = Path(error.filename) if error.filename is not None else path
            message = f"cannot read this folder ({error.strerror}); the files in it were skipped"
            found.append((folder, UnreadableFolder(shown(folder), message, path=folder)))

        for folder, subfolders, names in os.walk(path, onerror=unlisted):
            # Hidden entries (.git, .cache, an editor's .notes.md) are left out, as ripgrep and most
            # indexers do; the path given is read even when it is one.
            subfolders[:] = [name for name in subfolders if not name.startswith(".")]
            entries = [(Path(folder) / name, False) for name in subfolders]
            entries += [(Path(folder) / name, True) for name in names if not name.startswith(".")]
            for entry, is_file in entries:
                if entry.is_symlink() and confine is not None and not confine(entry.resolve()):
                    found.append((entry, SourceError(shown(entry), _ESCAPING_LINK)))
                elif not is_file and entry.is_symlink():  # os.walk lists it, never descends into it
                    # One into this same folder is walked under its real path; only one out of it is missed.
                    if not entry.resolve().is_relative_to(walked):
                        found.append((entry, SourceError(shown(entry), _LINKED_FOLDER)))
                elif is_file and entry.suffix.lower() in SUPPORTED_SUFFIXES:
                    found.append((entry, _source_file(entry, base)))
        yield from (item for _, item in sorted(found, key=lambda pair: pair[0]))
        if report_empty and not any(isinstance(i, SourceFile | UnreadableFolder) for _, i in found):
            kinds = ", ".join(sorted(SUPPORTED_SUFFIXES))
            yield NoSupportedFiles(shown(path), f"no files of a supported type ({kinds})")
    elif not path.exists():
        yield SourceError(shown(path), "no such file or folder")
    elif path.is_file() and path.suffix.lower() not in SUPPORTED_SUFFIXES:
        kinds = ", ".join(sorted(SUPPORTED_SUFFIXES))
        yield SourceError(shown(path), f"unsupported file type {path.suffix.lower()!r}; use one of {kinds}")
    else:
        yield _source_file(path, root or path.parent)  # a FIFO, socket or device: reported there


def _source_file(path: Path, root: Path) -> SourceFile | SourceError:
    # Its name becomes a document id, a title and metadata, which must be text (UTF-8) to be stored.
    if not is_utf8(str(path)) or not is_utf8(str(root.resolve())):
        return SourceError(shown(path), _NOT_UTF8_NAME)
    try:
        status = path.stat()
    except OSError as exc:
        return SourceError(shown(path), f"cannot read: {exc.strerror}")
    if (problem := _not_regular(status.st_mode)) is not None:
        return SourceError(shown(path), problem)
    return SourceFile(path, root, status.st_size, status.st_mtime)


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is never read, or None for a regular file.

    Opening a FIFO for reading waits for a writer, for ever, and a device may never end; neither is a
    document.
    """
    if stat.S_ISREG(mode):
        return None
    kinds = [
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISDIR, "a folder"),
    ]
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"not a regular file ({kind}); skipped"


def read_regular_file(path: Path) -> bytes | SourceError:
    """The bytes of the regular file at path, or why they were not read; anything else is never opened."""
    try:
        # Checked again here: the file may have been replaced since it was found.
        if (problem := _not_regular(path.stat().st_mode)) is not None:
            return SourceError(shown(path), problem)
        with open(os.open(path, os.O_RDONLY | _NONBLOCK), "rb") as handle:
            if (problem := _not_regular(os.fstat(handle.fileno()).st_mode)) is not None:
                return SourceError(shown(path), problem)  # replaced between the check and the open
            return handle.read()
    except OSError as exc:
        return SourceError(shown(path), f"cannot read: {exc.strerror}")


def read_file(
    file: SourceFile, *, csv_columns: CsvColumns | None = None
) -> Iterator[SourceDocument | SourceError]:
    """The documents of one file: one per text, HTML, PDF or Word file, one per .jsonl or .csv record."""
    data = read_regular_file(file.path)
    if isinstance(data, SourceError):
        yield data
        return
    yield from parse_file(file, data, csv_columns=csv_columns)


def parse_file(
    file: SourceFile, data: bytes, *, csv_columns: CsvColumns | None = None
) -> Iterator[SourceDocument | SourceError]:
    """The documents of a file already read, each carrying where it came from and the file's hash."""
    path, suffix = file.path, file.path.suffix.lower()
    provenance = {
        "source_path": file.relative,
        "source_root": str(file.root.resolve()),
        "mtime": datetime.fromtimestamp(file.mtime, UTC).isoformat(timespec="seconds"),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if suffix in EXTRACTORS:
        try:
            extracted = EXTRACTORS[suffix](data)
        except FormatError as exc:
            yield SourceError(str(path), str(exc))
            return
        except Exception as exc:  # a parser meeting a malformed file may raise anything; one file only
            yield SourceError(str(path), f"cannot parse this {suffix} file: {type(exc).__name__}: {exc}")
            return
        metadata = {"source": str(path), **provenance}
        yield SourceDocument(file.relative, extracted.text, extracted.title or path.stem, metadata)
        return
    try:
        text = decoded_text(data)
    except NotDecodable as exc:
        yield SourceError(str(path), str(exc))
        return
    if suffix in TEXT_SUFFIXES:
        yield _text_document(file, text, provenance)
        return
    records = (
        _jsonl_documents(path, text)
        if suffix == ".jsonl"
        else _csv_documents(path, text, csv_columns or CsvColumns())
    )
    for item in records:
        if isinstance(item, SourceDocument):
            item = SourceDocument(item.id, item.content, item.title, {**item.metadata, **provenance})
        yield item


class NotDecodable(ValueError):
    """Why a file's bytes are not text."""


def decoded_text(data: bytes) -> str:
    """The text of a file: UTF-8 (a BOM dropped), or UTF-16 or UTF-32 when it starts with their BOM.

    Windows PowerShell's `>` and Notepad's "Unicode" write UTF-16 with a BOM, which is unambiguous.
    """
    for bom, codec, name in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom) :].decode(codec)
            except UnicodeDecodeError as exc:
                message = f"not valid {name} (byte {exc.start + len(bom)}); convert the file to UTF-8"
                raise NotDecodable(message) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        message = f"not valid UTF-8 (line {line}, byte {exc.start}); convert the file to UTF-8"
        raise NotDecodable(message) from None


def _text_document(file: SourceFile, text: str, provenance: dict[str, Any]) -> SourceDocument:
    """A text or Markdown file: its title from front matter's `title`, a leading `# ` heading, or its name."""
    fields: dict[str, Any] = {}
    if file.path.suffix.lower() in MARKDOWN_SUFFIXES:
        fields, text = _front_matter(text)
        text = _without_html_comments(text)
    title = fields.pop("title", None) if isinstance(fields.get("title"), str) else None
    for line in text.splitlines():
        if line.startswith("# ") and not title:
            title = line[2:].strip()
        if line.strip():
            break
    metadata = {**fields, "source": str(file.path), **provenance}
    return SourceDocument(file.relative, text, title or file.path.stem, metadata)


def _front_matter(text: str) -> tuple[dict[str, Any], str]:
    """A Markdown file's YAML front matter (Jekyll, Hugo, Obsidian) as fields, and the text after it.

    Its scalars and lists of scalars become metadata (dates as ISO text), to filter on like any field;
    anything else in it is left out. Text that does not start with a `---` block of YAML mapping is
    returned whole, with no fields.
    """
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, text
    try:
        parsed = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}, text
    if not isinstance(parsed, dict):
        return {}, text
    fields: dict[str, Any] = {}
    for key, value in parsed.items():
        if isinstance(value, list) and all(_scalar(v) is not None for v in value):
            fields[str(key)] = [_scalar(v) for v in value]
        elif (scalar := _scalar(value)) is not None:
            fields[str(key)] = scalar
    return fields, text[match.end() :]


def _without_html_comments(text: str) -> str:
    """Markdown text without its HTML comments (`<!-- ... -->`), which a reader never sees rendered.

    Licence headers, TODOs and editor markers are no part of the document: stored, they were embedded and
    quoted in answers. markdown-it (CommonMark) tells a comment from `<!--` in code, in a code span or
    escaped, which are kept; so is a comment never closed (rendered, it may hide the rest of the file, but
    dropping that for one typo would lose the text it was meant to hold). Only the comments go: the
    raw HTML or text around them on their lines stays.
    """
    if "<!--" not in text:
        return text
    lines = _LINE_ENDS.split(text)  # markdown-it's lines: it ends one at \r\n, \r or \n
    for token in _MARKDOWN.parse(text):
        if token.map is None or token.type not in {"html_block", "inline"}:
            continue
        first, end = token.map
        block = "".join(lines[first:end])
        if token.type == "html_block":
            comments = _HTML_COMMENT.findall(token.content)
            found = _HTML_COMMENT.finditer(block)
        else:
            comments = [
                child.content
                for child in token.children or []
                if child.type == "html_inline" and _HTML_COMMENT.fullmatch(child.content)
            ]
            # Each comment where it is in the source: none in a code span, escaped, in a tag's attribute or
            # in a link's title. Should the source's comments still not be markdown-it's, one for one, which
            # is which is not known: the paragraph stays as written.
            matches = list(_inline_comments(block))
            same = [m[0] for m in matches] == comments
            found = iter(matches if same else [])
        # Each comment where it is in the source, in order: the same text quoted before it in a code span
        # or escaped is no comment. One in a list item or a quote that spans lines keeps its markers: kept.
        spans = [next((m.span() for m in found if m[0] == comment), (0, 0)) for comment in comments]
        for start, stop in reversed(spans):
            block = block[:start] + block[stop:]
        lines[first:end] = [block, *[""] * (end - first - 1)]
    return "".join(lines)


def _inline_comments(source: str) -> Iterator[re.Match[str]]:
    """The HTML comments in a paragraph's source as CommonMark reads it: none in a code span or escaped."""
    at = 0
    while (found := _INLINE_MARKUP.search(source, at)) is not None:
        at = found.end()
        if found["ticks"]:  # a code span runs to the next run of as many backticks (none: literal ticks)
            closing = re.compile(rf"(?<!`){found['ticks']}(?!`)").search(source, at)
            at = closing.end() if closing else at
        elif found["escape"] is None and (comment := _HTML_COMMENT.match(source, found.start())):
            at = comment.end()
            yield comment


def _scalar(value: Any) -> str | int | float | bool | None:
    """A front-matter value as JSON can hold it (a date as ISO text), or None for anything else."""
    if isinstance(value, date):  # a datetime too
        return value.isoformat()
    return value if isinstance(value, str | int | float | bool) else None


def _jsonl_documents(path: Path, text: str) -> Iterator[SourceDocument | SourceError]:
    """BEIR corpus lines: _id, title, text; any other key goes to metadata."""
    # On "\n" only (a "\r" before it dropped): U+2028, U+2029 and U+0085 may stand unescaped inside a
    # JSON string, and str.splitlines() would break the line there.
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            yield SourceError(f"{path}:{number}", f"invalid JSON: {exc}")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("text", record.get("content")), str):
            yield SourceError(f"{path}:{number}", "expected an object with a string 'text' (or 'content')")
            continue
        content = record.pop("text", None) or record.pop("content", "")
        doc_id = record.pop("_id", None) or record.pop("id", None)
        title = record.pop("title", "") or ""
        metadata = record.pop("metadata", None)
        extra = metadata if isinstance(metadata, dict) else {}
        yield SourceDocument(
            id=str(doc_id) if doc_id is not None else None,
            content=str(content),
            title=str(title),
            metadata={**record, **extra, "source": path.name},
        )


def _csv_documents(path: Path, text: str, columns: CsvColumns) -> Iterator[SourceDocument | SourceError]:
    if not text.strip():
        return  # an empty file holds no records (as an empty .jsonl), not a header without a text column
    header: list[str] | None = None
    try:
        for number, record in csv_records(text, csv_delimiter(text)):
            if header is None:
                header = record
                if columns.text not in header:
                    break
            elif record:  # a blank line is no record
                row = {name: record[i] if i < len(record) else None for i, name in enumerate(header)}
                yield _csv_row(path, number, row, columns)
    except CsvProblem as problem:
        yield SourceError(f"{path}:{problem.line}", f"{problem.reason}; the rows from here on were not read")
        return
    if header is None or columns.text not in header:
        found = ", ".join(header or [])
        yield SourceError(
            str(path), f"no text column {columns.text!r} (columns: {found}); pass --text-column"
        )


def _csv_row(
    path: Path, number: int, row: dict[str, Any], columns: CsvColumns
) -> SourceDocument | SourceError:
    """One CSV record (starting on line `number`) as a document, or why it is not one."""
    content = row.pop(columns.text) or ""
    doc_id = row.pop(columns.id, None) if columns.id else None
    title = (row.pop(columns.title, None) if columns.title else None) or ""
    if not content.strip():
        message = f"empty {columns.text!r} column"
        return SourceError(f"{path}:{number}", message, record=True, record_id=doc_id or None)
    metadata: dict[str, Any] = {k: v for k, v in row.items() if k is not None}
    metadata["source"] = path.name
    return SourceDocument(id=doc_id or None, content=content, title=title, metadata=metadata)
