"""The one-line install: the wheel, built from a clean copy of the sources, installed into a fresh virtual
environment with its dependencies, serves MCP through `iris-rag mcp` from a directory outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

import iris_rag
from iris_rag.schemas import tool_specs
from tests.conftest import ROOT
from tests.e2e.mcp_harness import result_json

pytestmark = [pytest.mark.e2e]

BUNDLE_IN_PACKAGE = "iris_rag/frontend/server.mjs"
DOCUMENTS = [
    {
        "id": "seine",
        "title": "Paris",
        "content": "Paris is the capital of France. The Seine flows through it.",
    },
    {"id": "alps", "title": "Alps", "content": "Mont Blanc is the highest mountain of the Alps, at 4,806 m."},
]
INSTALL_TIMEOUT_S = 900
EXPORT_TIMEOUT_S = 300
CALL_TIMEOUT_S = 180  # the first ingest also loads the embedding model in a cold environment


def _run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files a clone has (tracked, plus new ones not ignored), and the checkout's node_modules."""
    esbuild = ROOT / "node_modules" / ".bin" / "esbuild"
    if not esbuild.exists():
        reason = "node_modules has no esbuild: run `npm ci` first"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    copy = tmp_path_factory.mktemp("source")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        # Symlinks (a worktree's .venv) and files deleted but not yet staged are not part of a clone.
        if source.is_file() and not source.is_symlink():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    assert not (copy / BUNDLE_IN_PACKAGE).exists(), "the bundle is a build output, never committed"
    # Offline and fast: the build backend then runs esbuild alone, not `npm ci`.
    (copy / "node_modules").symlink_to(ROOT / "node_modules", target_is_directory=True)
    return copy


@pytest.fixture(scope="module")
def wheel(source_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel .` on the copy, as `uvx --from git+URL` builds it (the backend bundles the front end)."""
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", ".", "-w", str(out)], cwd=source_copy)
    (built,) = out.glob("iris_rag-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel and its dependencies (CPU torch pinned), as pipx makes."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(venv)], cwd=venv)
    started = time.perf_counter()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "-c", str(ROOT / "constraints.txt"), str(wheel)], cwd=venv)
    print(
        f"installed the wheel and its dependencies in {time.perf_counter() - started:.0f} s", file=sys.stderr
    )
    return venv


def test_wheel_carries_the_bundle_and_its_licenses(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        bundle = archive.read(BUNDLE_IN_PACKAGE).decode()
        licenses = archive.read("iris_rag/frontend/THIRD_PARTY_LICENSES.txt").decode()
    assert {"iris_rag/schemas/common.json", "iris_rag/launcher.py"} <= names
    # One self-contained file: nothing left for node_modules to resolve.
    assert 'from "@modelcontextprotocol/sdk' not in bundle and 'from "ajv' not in bundle
    assert "@modelcontextprotocol/sdk" in licenses and "ajv" in licenses


@pytest.mark.anyio
async def test_installed_command_serves_mcp_from_any_directory(venv: Path, tmp_path: Path) -> None:
    workdir, xdg = tmp_path / "elsewhere", tmp_path / "xdg"
    workdir.mkdir()
    # What an MCP host passes: a PATH (for node) and a home; no RAG_DATA_DIR, so the default applies.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_DATA_HOME": str(xdg)}
    params = StdioServerParameters(command=str(venv / "bin" / "iris-rag"), args=["mcp"], env=env, cwd=workdir)
    stray: list[str] = []

    async def on_message(message: Any) -> None:
        # A line on stdout that is not JSON-RPC reaches the client as an exception, not as a failure.
        if isinstance(message, Exception):
            stray.append(repr(message))

    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=on_message) as session,
    ):
        with anyio.fail_after(CALL_TIMEOUT_S):
            await session.initialize()
        tools = {tool.name for tool in (await session.list_tools()).tools}
        assert tools == {spec["name"] for spec in tool_specs()}

        ingested = await _call(session, "rag_ingest", {"collection_id": "notes", "documents": DOCUMENTS})
        assert sorted(ingested["document_ids"]) == ["alps", "seine"]
        query = {
            "query": "Which river flows through Paris?",
            "collection_id": "notes",
            "options": {"top_k": 2},
        }
        answer = await _call(session, "rag_basic", query)
        # No setup.sh ran here: this first start serves on torch and exports ONNX for the next one.
        first_backend, export = await _embedder(session)
        deadline = time.monotonic() + EXPORT_TIMEOUT_S
        while export == "exporting" and time.monotonic() < deadline:
            await anyio.sleep(1)
            _, export = await _embedder(session)

    assert first_backend == "torch" and export is not None and export.startswith("exported: "), export
    assert answer["retrieved_documents"][0]["id"] == "seine"
    assert {doc["id"] for doc in answer["retrieved_documents"]} <= {"seine", "alps"}
    assert "[1]" in answer["answer"] and "Seine" in answer["answer"]
    # Not ./data in the host's directory nor in site-packages: the user's data folder.
    assert (xdg / "iris-rag" / "iris_rag.sqlite3").is_file()
    assert not (workdir / "data").exists()
    assert stray == []

    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        with anyio.fail_after(CALL_TIMEOUT_S):
            await session.initialize()
        await _call(session, "rag_basic", query)
        assert (await _embedder(session))[0] == "onnx", "the second start loads the export"


@pytest.mark.anyio
async def test_installed_command_reads_the_dotenv_where_it_starts(venv: Path, tmp_path: Path) -> None:
    # The template's empty MCP_SERVER_VERSION= crashed the bundle (no package.json in site-packages), and
    # nothing read the .env the template says to copy.
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    (workdir / ".env").write_text(
        "MCP_SERVER_VERSION=\nEMBEDDING_DIMENSIONS=\nRAG_DATA_DIR=store\n"
        "RAG_DEFAULT_COLLECTION=from-dotenv\nRAG_TECHNIQUES=basic\n",
        encoding="utf-8",
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    params = StdioServerParameters(command=str(venv / "bin" / "iris-rag"), args=["mcp"], env=env, cwd=workdir)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        with anyio.fail_after(CALL_TIMEOUT_S):
            initialized = await session.initialize()
        assert initialized.serverInfo.version == iris_rag.__version__
        assert "rag_colbert" not in {tool.name for tool in (await session.list_tools()).tools}
        await _call(session, "rag_ingest", {"collection_id": "from-dotenv", "documents": DOCUMENTS})
        answer = await _call(session, "rag_basic", {"query": "Which river flows through Paris?"})
    assert answer["metadata"]["collection_id"] == "from-dotenv"
    # A relative RAG_DATA_DIR, from the .env too, is the starting directory's.
    assert (workdir / "store" / "iris_rag.sqlite3").is_file()


async def _embedder(session: ClientSession) -> tuple[str | None, str | None]:
    health = await _call(session, "rag_health_check", {"include_details": True})
    details = health["components"]["embedding_service"]["details"]
    return details.get("backend"), details.get("onnx_export")


async def _call(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(name, arguments)
    assert isinstance(result.content[0], TextContent)
    body = result_json(result)
    assert not result.isError, body
    return body


def test_sdist_carries_the_bundle_and_builds_a_wheel_without_typescript(
    source_copy: Path, tmp_path: Path
) -> None:
    """`python -m build` goes through the sdist: it must hold the backend and the bundle, not mcp-server/."""
    build = "import sys, build_backend; print(build_backend.build_sdist(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(source_copy / "scripts")}
    name = _run([sys.executable, "-c", build, str(tmp_path)], cwd=source_copy, env=env).stdout.split()[-1]
    sdist = tmp_path / name
    with tarfile.open(sdist) as archive:
        members = {member.split("/", 1)[1] for member in archive.getnames() if "/" in member}
    assert {BUNDLE_IN_PACKAGE, "scripts/build_backend.py"} <= members
    assert not any(member.startswith("mcp-server/") for member in members)

    out = tmp_path / "wheel"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(sdist), "-w", str(out)],
        cwd=tmp_path,
    )
    (built,) = out.glob("iris_rag-*.whl")
    with zipfile.ZipFile(built) as archive:
        assert archive.read(BUNDLE_IN_PACKAGE) == (source_copy / BUNDLE_IN_PACKAGE).read_bytes()


def test_build_without_npm_names_the_fix(source_copy: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(source_copy, bare, ignore=shutil.ignore_patterns("node_modules", "frontend", "build"))
    # PATH holds this Python alone: no node, no npm.
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python").symlink_to(sys.executable)
    env = {"PATH": str(tools), "PYTHONPATH": str(bare / "scripts"), "HOME": str(tmp_path)}
    build = "import sys, build_backend; build_backend.build_wheel(sys.argv[1])"
    result = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)],
        cwd=bare,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "BundleError" in result.stderr and "npm is not on PATH" in result.stderr
