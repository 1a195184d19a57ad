"""rag_ingest's `paths`: the files a call names under RAG_INGEST_ROOTS, read into documents in the worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.loaders import (
    NoSupportedFiles,
    SourceDocument,
    SourceError,
    SourceFile,
    find_files,
    read_file,
)
from iris_rag.ingestion.roots import IngestRoots


@dataclass
class PathDocuments:
    """The documents read from a call's paths, which path each came from, and the files that failed."""

    documents: list[SourceDocument] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)  # for each document, its path's position in `paths`
    errors: list[dict[str, Any]] = field(default_factory=list)  # rag_ingest's errors[] items

    def file_error(self, position: int, location: str, message: str, code: str = "UNREADABLE_FILE") -> None:
        """Report a file (or a path) that gave no document."""
        self.errors.append({"index": position, "id": None, "code": code, "message": f"{location}: {message}"})


def read_paths(paths: list[str], roots: IngestRoots, *, max_bytes: int) -> PathDocuments:
    """Read every supported file the paths name; any path outside the roots refuses the whole call.

    The files' total size is checked against `max_bytes` before any is read. A file named twice (itself
    and through its folder) is read once.
    """
    located = [roots.locate(path) for path in paths]
    result = PathDocuments()
    files: list[tuple[int, SourceFile]] = []
    seen: set[Path] = set()
    for position, (root, real) in enumerate(located):
        for item in find_files(real, root=root, confine=roots.contains, report_empty=True):
            if isinstance(item, NoSupportedFiles):
                result.file_error(position, item.location, item.message, "NO_FILES")
            elif isinstance(item, SourceError):
                result.file_error(position, item.location, item.message)
            elif (key := item.path.resolve()) not in seen:
                seen.add(key)
                files.append((position, item))
    total = sum(file.size for _, file in files)
    if total > max_bytes:
        msg = (
            f"the paths hold {total:,} bytes of files, over the {max_bytes:,} one call may read "
            "(RAG_INGEST_MAX_BYTES); name fewer files or folders per call"
        )
        raise InvalidParametersError(msg, {"bytes": total, "max_bytes": max_bytes})
    for position, file in files:
        check_cancelled()  # parsing a folder of PDFs takes a while; a cancelled call stops here
        for read in read_file(file):
            if isinstance(read, SourceError):
                result.file_error(position, read.location, read.message)
            else:
                result.documents.append(read)
                result.origins.append(position)
    return result
