"""The Node front end explains every error code the worker can send."""

from __future__ import annotations

import re
from pathlib import Path

from iris_rag import errors

ROOT = Path(__file__).resolve().parents[1]


def worker_codes() -> set[str]:
    return {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.RagError) and cls is not errors.RagError
    }


def test_every_worker_error_code_has_a_front_end_hint() -> None:
    source = (ROOT / "mcp-server" / "src" / "errors.ts").read_text()
    hinted = set(re.findall(r"^\s+([A-Z_]+):", source, flags=re.MULTILINE))
    missing = worker_codes() - hinted
    assert not missing, f"add hints for {sorted(missing)} to mcp-server/src/errors.ts"
