"""Fixtures for the end-to-end tests that drive the built Node MCP server."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO_ROOT = Path(__file__).resolve().parents[2]
INITIALIZE_TIMEOUT_S = 120  # the worker starts with the server; a busy machine is slow to start it
# The store the servers run on: sqlite (the default) or postgres, a fresh database per test module on the
# session's PostgreSQL (tests/conftest.py), handed to the server as RAG_STORE and RAG_POSTGRES_URL.
E2E_STORE = os.environ.get("E2E_RAG_STORE", "sqlite")
_databases = itertools.count()


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
def store_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The RAG_* variables selecting an empty store of the E2E_RAG_STORE backend (none for sqlite)."""
    if E2E_STORE == "sqlite":
        yield {}
        return
    if E2E_STORE != "postgres":
        pytest.fail(f"E2E_RAG_STORE must be sqlite or postgres, not {E2E_STORE!r}")
    import psycopg

    server: str = request.getfixturevalue("postgres_server")
    name = f"e2e_{next(_databases)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield {"RAG_STORE": "postgres", "RAG_POSTGRES_URL": server.replace("/postgres?", f"/{name}?", 1)}
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory, store_env: dict[str, str]) -> dict[str, str]:
    """What an MCP host passes the server: our environment, an empty store, and this Python for the worker."""
    return {
        **os.environ,
        "RAG_DATA_DIR": str(tmp_path_factory.mktemp("rag-data")),
        "IRIS_RAG_PYTHON": os.environ.get("IRIS_RAG_PYTHON", sys.executable),
        **store_env,
    }


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def session(
    repo_root: Path, server_entry: Path, server_env: dict[str, str]
) -> AsyncIterator[ClientSession]:
    """One real server per test module, spawned as an MCP host does, through the official client."""
    params = StdioServerParameters(command="node", args=[str(server_entry)], env=server_env, cwd=repo_root)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(INITIALIZE_TIMEOUT_S):
            initialized = await client.initialize()
        SERVER_INSTRUCTIONS[id(client)] = initialized.instructions or ""
        yield client


# What each session's server said in `initialize` (instructions), by id(session).
SERVER_INSTRUCTIONS: dict[int, str] = {}


@pytest.fixture(scope="module")
def server_instructions(session: ClientSession) -> str:
    """The `instructions` the server sent this module's session."""
    return SERVER_INSTRUCTIONS[id(session)]
