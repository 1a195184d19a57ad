"""What a client's model reads from the server: tools/list, the instructions, and a result's text content.

Spawns the built server over stdio with the official MCP client (as an MCP host does), on a data folder
where the collection is already ingested, and prints character counts: tools/list (whole and per tool),
the server's instructions, and for each query the text content next to the structuredContent JSON.

    .venv/bin/python -m bench.bench_tool_surface --data-dir DIR --collection NAME --queries FILE
        [--tool rag_hybrid_ifind] [--top-k 5] [--limit 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from bench.common import ROOT, machine, median, read_jsonl, write


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "RAG_DATA_DIR": str(args.data_dir), "IRIS_RAG_PYTHON": sys.executable}
    params = StdioServerParameters(
        command="node", args=[str(ROOT / "mcp-server" / "dist" / "index.js")], env=env
    )
    queries = [row["text"] for row in read_jsonl(args.queries, args.limit)]
    async with stdio_client(params) as (read, write_), ClientSession(read, write_) as session:
        initialized = await session.initialize()
        listed = await session.list_tools()
        text_sizes: list[int] = []
        json_sizes: list[int] = []
        for query in queries:
            arguments = {"query": query, "collection_id": args.collection, "options": {"top_k": args.top_k}}
            result = await session.call_tool(args.tool, arguments)
            content = result.content[0]
            assert isinstance(content, TextContent) and not result.isError, result.content
            text_sizes.append(len(content.text))
            json_sizes.append(len(json.dumps(result.structuredContent, ensure_ascii=False)))
    per_tool = {
        tool.name: len(tool.model_dump_json(by_alias=True, exclude_none=True)) for tool in listed.tools
    }
    return {
        "machine": machine(),
        "tools_list_chars": len(listed.model_dump_json(by_alias=True, exclude_none=True)),
        "tool_count": len(listed.tools),
        "per_tool_chars": per_tool,
        "instructions_chars": len(initialized.instructions or ""),
        "tool": args.tool,
        "top_k": args.top_k,
        "queries": len(queries),
        "text_chars_median": median([float(n) for n in text_sizes]),
        "structured_json_chars_median": median([float(n) for n in json_sizes]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--tool", default="rag_hybrid_ifind")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(
        f"tools/list: {result['tools_list_chars']} characters for {result['tool_count']} tools",
        file=sys.stderr,
    )
    print(f"instructions: {result['instructions_chars']} characters", file=sys.stderr)
    ratio = result["text_chars_median"] / result["structured_json_chars_median"]
    print(
        f"{args.tool} top_k {args.top_k}: text {result['text_chars_median']:.0f} vs JSON "
        f"{result['structured_json_chars_median']:.0f} characters "
        f"(median of {result['queries']}; {ratio:.2f}x)",
        file=sys.stderr,
    )
    write(args.out, result)


if __name__ == "__main__":
    main()
