"""`iris-rag mcp`: the bundled MCP front end under Node, its worker run by this very Python."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import iris_rag
from iris_rag.settings import SettingsError, dotenv_file, dotenv_under, read_dotenv

# Built by `npm run bundle` (the wheel build runs it); two folders below the one holding iris_rag/, where
# the front end looks for iris_rag/schemas/ and starts the worker (mcp-server/bundle.mjs).
BUNDLE = Path(__file__).resolve().parent / "frontend" / "server.mjs"
MIN_NODE_MAJOR = 20

Transport = Literal["stdio", "http"]


class LaunchError(Exception):
    """The front end cannot start here (no Node, too old a Node, no bundle): a command-line failure."""


def find_node(environ: Mapping[str, str]) -> str:
    """The Node executable (IRIS_RAG_NODE, else `node` on PATH), checked to be version 20 or newer."""
    wanted = environ.get("IRIS_RAG_NODE", "").strip()
    node = shutil.which(wanted or "node", path=environ.get("PATH"))
    if node is None:
        where = f"IRIS_RAG_NODE={wanted!r} is not an executable" if wanted else "`node` is not on PATH"
        msg = (
            f"serving MCP needs Node.js {MIN_NODE_MAJOR} or newer and {where}: install it "
            "(https://nodejs.org), or set IRIS_RAG_NODE to its path (MCP hosts often start servers with "
            "a short PATH)"
        )
        raise LaunchError(msg)
    try:
        completed = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        msg = f"could not run `{node} --version`: {exc}"
        raise LaunchError(msg) from exc
    version = completed.stdout.strip()
    match = re.fullmatch(r"v(\d+)\.\d+\.\d+.*", version)
    if match is None:
        msg = f"`{node} --version` printed {version!r}, not a Node.js version"
        raise LaunchError(msg)
    if int(match.group(1)) < MIN_NODE_MAJOR:
        msg = f"{node} is Node.js {version}; iris-rag needs {MIN_NODE_MAJOR} or newer"
        raise LaunchError(msg)
    return node


def find_bundle() -> Path:
    """The bundled front end; in a checkout it exists only after `npm run bundle`."""
    if not BUNDLE.is_file():
        msg = (
            f"the bundled MCP front end {BUNDLE} is missing: this iris_rag was not installed from a wheel. "
            "In a repository checkout run `npm run bundle`, or serve mcp-server/dist with `npm start`"
        )
        raise LaunchError(msg)
    return BUNDLE


def front_end_environment(
    environ: Mapping[str, str], transport: Transport | None, cwd: Path
) -> dict[str, str]:
    """The front end's environment: the caller's over the .env of the start folder, with this Python.

    Installed, the front end and its worker run in site-packages, so the user's .env is read here, and the
    front end passes it all on to the worker.
    """
    try:
        dotenv = read_dotenv(dotenv_file(cwd))
    except SettingsError as exc:
        raise LaunchError(str(exc)) from None
    env = {**environ, **dotenv_under(environ, dotenv)}
    # This interpreter has this iris_rag, whose schemas the bundle serves: never another Python's.
    env["IRIS_RAG_PYTHON"] = sys.executable
    # An installed package has no package.json for the front end to read its version from.
    if not env.get("MCP_SERVER_VERSION", "").strip():
        env["MCP_SERVER_VERSION"] = iris_rag.__version__
    if transport is not None:
        env["MCP_TRANSPORT"] = transport
    # The worker runs in site-packages: a relative folder means the one `iris-rag mcp` was started in.
    data_dir = env.get("RAG_DATA_DIR", "").strip()
    if data_dir and not Path(data_dir).is_absolute():
        env["RAG_DATA_DIR"] = str(cwd / data_dir)
    return env


def serve(transport: Transport | None = None) -> int:
    """Become the MCP server: Node runs the bundle on our stdin, stdout (protocol only) and stderr."""
    bundle = find_bundle()
    node = find_node(os.environ)
    env = front_end_environment(os.environ, transport, Path.cwd())
    argv = [node, str(bundle)]
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "posix":
        # Replace this process: the MCP host's signals and pipes reach Node itself, and its exit is ours.
        os.execve(node, argv, env)
    # Windows has no exec that keeps the process: wait for Node instead (Ctrl+C reaches the whole group).
    return subprocess.run(argv, env=env, check=False).returncode
