"""Fixtures for the end-to-end tests that drive the built Node MCP server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def server_entry() -> Path:
    """The built server; skipped when `npm run build` has not run, except in CI where that is a failure."""
    entry = REPO_ROOT / "mcp-server" / "dist" / "index.js"
    if not entry.is_file():
        reason = f"{entry.relative_to(REPO_ROOT)} is missing: run `npm ci && npm run build` first"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return entry


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What an MCP host passes the server: our environment, an empty store, and this Python for the worker."""
    return {
        **os.environ,
        "RAG_DATA_DIR": str(tmp_path_factory.mktemp("rag-data")),
        "IRIS_RAG_PYTHON": os.environ.get("IRIS_RAG_PYTHON", sys.executable),
    }
