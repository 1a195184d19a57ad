"""Ask the bundled sample questions through the real MCP server, as an MCP client would."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[1]


async def run(questions: list[str], collection: str, top_k: int) -> None:
    """Start `node mcp-server/dist/index.js` over stdio, list its tools, ask each question with rag_basic."""
    server = StdioServerParameters(
        command="node",
        args=[str(ROOT / "mcp-server" / "dist" / "index.js")],
        env=dict(os.environ),
        cwd=str(ROOT),
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        print(f"MCP server tools: {', '.join(t.name for t in tools.tools)}\n")
        for question in questions:
            result = await session.call_tool(
                "rag_basic", {"query": question, "collection_id": collection, "options": {"top_k": top_k}}
            )
            if result.isError or result.structuredContent is None:
                error = json.loads(result.content[0].text)["error"]  # type: ignore[union-attr]
                print(f"Q: {question}\nerror: {error['code']}: {error['message']}\n")
                continue
            # The text content is what a model reads (answer and sources); the whole result is structured.
            payload: dict[str, Any] = result.structuredContent
            print(f"Q: {question}\n{payload['answer']}")
            took = payload["performance"]["total_time_ms"]
            print(f"({took:.0f} ms; top document {payload['retrieved_documents'][0]['id']})\n")
        health = await session.call_tool("rag_health_check", {})
        print("health:", json.loads(health.content[0].text)["status"])  # type: ignore[union-attr]


def main() -> None:
    """Parse arguments and run the demo."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("questions", nargs="*", help="questions to ask (default: three sample claims)")
    parser.add_argument("--collection", default="scifact-sample")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args()
    questions = args.questions
    if not questions:
        lines = (ROOT / "samples" / "scifact" / "queries.jsonl").read_text(encoding="utf-8").splitlines()
        questions = [json.loads(line)["text"] for line in lines[2:5]]
    anyio.run(run, questions, args.collection, args.top_k)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
