"""`iris-rag mcp` before it becomes the front end: Node found and recent, the bundle there, the env."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import iris_rag
from iris_rag import cli, launcher, settings
from iris_rag.launcher import LaunchError, find_node, front_end_environment
from iris_rag.settings import default_data_dir


def _fake_node(folder: Path, version: str) -> Path:
    """An executable `node` that only answers --version: an old Node cannot be installed here."""
    folder.mkdir(parents=True, exist_ok=True)
    node = folder / "node"
    node.write_text(f"#!/bin/sh\necho {version}\n")
    node.chmod(0o755)
    return node


def test_finds_the_real_node_on_path() -> None:
    real = shutil.which("node")
    if real is None:
        pytest.skip("node is not installed")
    assert find_node({"PATH": str(Path(real).parent)}) == real


def test_no_node_on_path_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"Node\.js 20 or newer and `node` is not on PATH.*IRIS_RAG_NODE"):
        find_node({"PATH": str(tmp_path)})


def test_node_older_than_20_is_refused(tmp_path: Path) -> None:
    _fake_node(tmp_path, "v18.19.0")
    with pytest.raises(LaunchError, match=r"is Node\.js v18\.19\.0; iris-rag needs 20 or newer"):
        find_node({"PATH": str(tmp_path)})


def test_iris_rag_node_overrides_path(tmp_path: Path) -> None:
    chosen = _fake_node(tmp_path / "chosen", "v22.1.0")
    _fake_node(tmp_path / "on-path", "v18.0.0")
    assert find_node({"PATH": str(tmp_path / "on-path"), "IRIS_RAG_NODE": str(chosen)}) == str(chosen)
    with pytest.raises(LaunchError, match="IRIS_RAG_NODE='/nowhere/node' is not an executable"):
        find_node({"PATH": str(tmp_path / "on-path"), "IRIS_RAG_NODE": "/nowhere/node"})


def test_not_a_version_is_refused(tmp_path: Path) -> None:
    _fake_node(tmp_path, "hello")
    with pytest.raises(LaunchError, match=r"not a Node\.js version"):
        find_node({"PATH": str(tmp_path)})


def test_environment_runs_the_worker_with_this_python(tmp_path: Path) -> None:
    caller = {"IRIS_RAG_PYTHON": "/other/python", "RAG_DATA_DIR": "notes/data", "KEEP": "1"}
    env = front_end_environment(caller, "http", tmp_path)
    assert env["IRIS_RAG_PYTHON"] == sys.executable
    assert env["MCP_TRANSPORT"] == "http"
    assert env["MCP_SERVER_VERSION"] == iris_rag.__version__
    # The worker runs in site-packages: a relative folder is the caller's.
    assert env["RAG_DATA_DIR"] == str(tmp_path / "notes" / "data")
    assert env["KEEP"] == "1"


def test_environment_keeps_what_the_caller_chose(tmp_path: Path) -> None:
    caller = {"RAG_DATA_DIR": "/srv/rag", "MCP_SERVER_VERSION": "9.9", "MCP_TRANSPORT": "http"}
    env = front_end_environment(caller, None, tmp_path)
    assert (env["RAG_DATA_DIR"], env["MCP_SERVER_VERSION"], env["MCP_TRANSPORT"]) == (
        "/srv/rag",
        "9.9",
        "http",
    )
    assert "RAG_DATA_DIR" not in front_end_environment({}, None, tmp_path)


def test_environment_reads_the_dotenv_of_the_start_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Installed, the front end and its worker run in site-packages: the user's .env is where they start.
    monkeypatch.setattr(settings, "checkout_root", lambda: None)
    (tmp_path / ".env").write_text(
        "RAG_DATA_DIR=stores\nREQUEST_TIMEOUT_MS=5000\nMCP_TRANSPORT=http\nLOG_LEVEL=DEBUG\n",
        encoding="utf-8",
    )
    env = front_end_environment({"REQUEST_TIMEOUT_MS": "7000", "LOG_LEVEL": ""}, None, tmp_path)
    assert env["RAG_DATA_DIR"] == str(tmp_path / "stores")
    # The environment wins over the file; empty there is as good as unset.
    assert (env["REQUEST_TIMEOUT_MS"], env["MCP_TRANSPORT"], env["LOG_LEVEL"]) == ("7000", "http", "DEBUG")


def test_an_unreadable_dotenv_is_a_launch_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "checkout_root", lambda: None)
    (tmp_path / ".env").mkdir()
    with pytest.raises(LaunchError, match=r"could not read .*\.env"):
        front_end_environment({}, None, tmp_path)


def test_an_empty_server_version_is_the_package_version(tmp_path: Path) -> None:
    # MCP_SERVER_VERSION= (as .env.template ships it) made the bundle look for a package.json it lacks.
    env = front_end_environment({"MCP_SERVER_VERSION": " "}, None, tmp_path)
    assert env["MCP_SERVER_VERSION"] == iris_rag.__version__


def test_mcp_command_without_a_bundle_exits_2_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(launcher, "BUNDLE", tmp_path / "server.mjs")
    assert cli.main(["mcp"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "iris-rag mcp: the bundled MCP front end" in captured.err and "npm run bundle" in captured.err


def test_mcp_command_without_node_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "server.mjs"
    bundle.write_text("")
    monkeypatch.setattr(launcher, "BUNDLE", bundle)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("IRIS_RAG_NODE", raising=False)
    assert cli.main(["mcp", "--transport", "stdio"]) == 2
    assert "`node` is not on PATH" in capsys.readouterr().err


def test_a_checkout_keeps_its_data_in_the_repository() -> None:
    assert default_data_dir() == Path(__file__).resolve().parents[1] / "data"
