"""Which files a client may have the server read: only those under the folders of RAG_INGEST_ROOTS.

Every check is on resolved real paths, so neither `..` nor a symlink leads out of a root. Unset means no
file at all is readable over MCP; the CLI, run by the local user, does not go through this guard.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from iris_rag.errors import InvalidParametersError

SETTING = "RAG_INGEST_ROOTS"


@dataclass(frozen=True)
class IngestRoots:
    """The resolved root folders; a path is readable only if its real path lies under one of them."""

    folders: tuple[Path, ...]

    @classmethod
    def parse(cls, setting: str) -> IngestRoots:
        """Read RAG_INGEST_ROOTS: folders separated by os.pathsep or commas, resolved now."""
        names = [name.strip() for name in re.split(f"[,{re.escape(os.pathsep)}]", setting)]
        return cls(tuple(dict.fromkeys(Path(name).expanduser().resolve() for name in names if name)))

    def contains(self, real_path: Path) -> bool:
        """Whether a resolved path is one of the roots or lies under one."""
        return any(real_path.is_relative_to(folder) for folder in self.folders)

    def locate(self, path: str) -> tuple[Path, Path]:
        """The root a client's path lies under and the path's real location; refused otherwise.

        A path outside every root is refused with the same words whether it exists or not, so the answer
        says nothing about the file system outside the roots.
        """
        if not self.folders:
            msg = (
                f"reading files is disabled on this server: {SETTING} is not set; send the text as "
                f"documents, or have the operator set {SETTING} to the folders clients may ingest"
            )
            raise InvalidParametersError(msg)
        if "\x00" in path:  # no file name holds one; the operating system refuses it (ValueError)
            msg = f"path {path!r} contains a NUL character, which no file name can hold"
            raise InvalidParametersError(msg)
        candidate = Path(path)
        if not candidate.is_absolute():
            msg = f"path {path!r} must be absolute, under {self._listing()}"
            raise InvalidParametersError(msg)
        # Non-strict first: it follows the symlinks that exist without telling whether the rest does.
        real = candidate.resolve()
        root = self._root_of(real)
        if root is None:
            msg = f"path {path!r} is outside {SETTING}; give a file or folder under {self._listing()}"
            raise InvalidParametersError(msg)
        try:
            real = candidate.resolve(strict=True)
        except OSError:
            msg = f"path {path!r} does not exist (or cannot be read) under {root}"
            raise InvalidParametersError(msg) from None
        # Resolved again now that it exists: a symlink made meanwhile must not lead out either.
        root = self._root_of(real)
        if root is None:
            msg = f"path {path!r} is outside {SETTING}; give a file or folder under {self._listing()}"
            raise InvalidParametersError(msg)
        return root, real

    def _root_of(self, real_path: Path) -> Path | None:
        # The deepest root wins, so that source paths are the shortest and stable when roots nest.
        inside = [folder for folder in self.folders if real_path.is_relative_to(folder)]
        return max(inside, key=lambda folder: len(folder.parts)) if inside else None

    def _listing(self) -> str:
        return ", ".join(str(folder) for folder in self.folders)
