"""The .env beside .env.template through the real server: the front end reads it, under the environment, and
passes it on to its worker; the CLI reads the same file the same way."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from iris_rag.settings import read_dotenv
from tests.e2e.mcp_harness import result_json

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# What the CLI (python-dotenv) and the front end (config.ts parseDotenv) must read alike.
TRICKY_DOTENV = (
    "\ufeff# a comment\n"
    "export LLM_MODEL='my model' # after the value\n"
    'LLM_BASE_URL="http://h/${HOME}/v1"\n'
    "EMPTY=\n"
    "EMPTY_WITH_NOTE= # a note\n"
    "HASH=a#b\n"
    "INLINE=notes  # inline\n"
    "NO_EQUALS\n"
    "  SPACED = value with spaces  \r\n"
    'ESCAPED="a\\nb\\t\\"q\\" \\\\ \\x"\n'
    "SINGLE='it\\'s \\n'\n"
    'MULTI="line one\nline two"\n'
    "'QUOTED_KEY'=1\n"
    'UNTERMINATED="open\n'
    "JUNK='a' b\n"
    "LAST=1"
)


def test_the_front_end_reads_a_dotenv_as_the_cli_does(tmp_path: Path, server_entry: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(TRICKY_DOTENV, encoding="utf-8")
    config = (server_entry.parent / "config.js").as_uri()
    script = (
        f"import {{ parseDotenv }} from {json.dumps(config)};"
        "import { readFileSync } from 'node:fs';"
        "console.log(JSON.stringify(Object.fromEntries(parseDotenv(readFileSync(process.argv[1], 'utf8')))));"
    )
    completed = subprocess.run(
        ["node", "--input-type=module", "-e", script, str(dotenv)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(completed.stdout) == read_dotenv(dotenv)
    assert read_dotenv(dotenv)["LLM_BASE_URL"] == "http://h/${HOME}/v1"


@pytest.fixture
def checkout(tmp_path: Path, repo_root: Path, server_entry: Path) -> Path:
    """A checkout of its own (the built front end, the same iris_rag): its root's .env is the test's."""
    root = tmp_path / "checkout"
    shutil.copytree(server_entry.parent, root / "mcp-server" / "dist")
    shutil.copy(repo_root / "package.json", root / "package.json")
    for shared in ("node_modules", "iris_rag"):
        (root / shared).symlink_to(repo_root / shared)
    return root


async def test_the_server_passes_its_checkouts_dotenv_to_the_worker(
    checkout: Path, server_env: dict[str, str], tmp_path: Path
) -> None:
    # The tester's repro: a .env copied from .env.template was ignored by the server and the CLI alike.
    (checkout / ".env").write_text(
        "RAG_DEFAULT_COLLECTION=from-dotenv\nRAG_TECHNIQUES=basic\nMCP_SERVER_NAME=\nRAG_DATA_DIR=ignored\n",
        encoding="utf-8",
    )
    env = {name: value for name, value in server_env.items() if name != "RAG_DEFAULT_COLLECTION"}
    env |= {"RAG_TECHNIQUES": "", "RAG_DATA_DIR": str(tmp_path / "data")}
    entry = checkout / "mcp-server" / "dist" / "index.js"
    # Started from another folder, as an MCP host does: the checkout's .env is still the one read.
    params = StdioServerParameters(command="node", args=[str(entry)], env=env, cwd=str(tmp_path))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        with anyio.fail_after(120):
            initialized = await session.initialize()
            assert initialized.serverInfo.name == "iris-rag"
            tools = {tool.name for tool in (await session.list_tools()).tools}
            assert "rag_basic" in tools and "rag_colbert" not in tools
            document = {"id": "kudu", "content": "Kudu are antelopes with spiral horns."}
            await session.call_tool("rag_ingest", {"collection_id": "from-dotenv", "documents": [document]})
            # A query naming no collection searches RAG_DEFAULT_COLLECTION: the worker's, from the file.
            answer = result_json(
                await session.call_tool("rag_basic", {"query": "Which antelope has spiral horns?"})
            )
    assert answer["metadata"]["collection_id"] == "from-dotenv", answer
    # The environment's RAG_DATA_DIR won over the file's.
    assert (tmp_path / "data" / "iris_rag.sqlite3").is_file()
