"""Source readers: text and markdown files, BEIR-style JSON lines, CSV; each yields documents or errors."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

TEXT_SUFFIXES = {".txt", ".md", ".markdown"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | {".jsonl", ".csv"}


@dataclass(frozen=True)
class SourceDocument:
    """A document read from a file, before chunking."""

    id: str | None
    content: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceError:
    """A file or record that could not be read; reported, never fatal to the rest."""

    location: str
    message: str


@dataclass(frozen=True)
class CsvColumns:
    """Which CSV columns hold the text, the id and the title."""

    text: str = "text"
    id: str | None = "id"
    title: str | None = "title"


def iter_source(
    path: Path, *, csv_columns: CsvColumns | None = None
) -> Iterator[SourceDocument | SourceError]:
    """Read a file, or every supported file under a folder (sorted, so ids and order are stable)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_SUFFIXES)
        for file in files:
            yield from _iter_file(file, root=path, csv_columns=csv_columns or CsvColumns())
    elif path.is_file():
        yield from _iter_file(path, root=path.parent, csv_columns=csv_columns or CsvColumns())
    else:
        yield SourceError(str(path), "no such file or folder")


def _iter_file(path: Path, *, root: Path, csv_columns: CsvColumns) -> Iterator[SourceDocument | SourceError]:
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        yield SourceError(str(path), f"unsupported file type {suffix!r}; use .txt, .md, .jsonl or .csv")
        return
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        yield SourceError(str(path), f"not valid UTF-8 (byte {exc.start}); convert the file to UTF-8")
        return
    except OSError as exc:
        yield SourceError(str(path), f"cannot read: {exc.strerror}")
        return
    if suffix in TEXT_SUFFIXES:
        yield _text_document(path, root, text)
    elif suffix == ".jsonl":
        yield from _jsonl_documents(path, text)
    else:
        yield from _csv_documents(path, text, csv_columns)


def _text_document(path: Path, root: Path, text: str) -> SourceDocument:
    title = path.stem
    for line in text.splitlines():
        if line.startswith("# "):
            title = line[2:].strip()
            break
        if line.strip():
            break
    relative = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    return SourceDocument(id=relative, content=text, title=title, metadata={"source": str(path)})


def _jsonl_documents(path: Path, text: str) -> Iterator[SourceDocument | SourceError]:
    """BEIR corpus lines: _id, title, text; any other key goes to metadata."""
    for number, line in enumerate(text.splitlines(), start=1):
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
    csv.field_size_limit(sys.maxsize)
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None or columns.text not in reader.fieldnames:
        found = ", ".join(reader.fieldnames or [])
        yield SourceError(
            str(path), f"no text column {columns.text!r} (columns: {found}); pass --text-column"
        )
        return
    for number, row in enumerate(reader, start=2):
        content = row.pop(columns.text) or ""
        doc_id = row.pop(columns.id, None) if columns.id else None
        title = (row.pop(columns.title, None) if columns.title else None) or ""
        if not content.strip():
            yield SourceError(f"{path}:{number}", f"empty {columns.text!r} column")
            continue
        metadata: dict[str, Any] = {k: v for k, v in row.items() if k is not None}
        metadata["source"] = path.name
        yield SourceDocument(id=doc_id or None, content=content, title=title, metadata=metadata)
