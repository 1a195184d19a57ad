"""The built MCP server driven with raw JSON-RPC lines, for frames the official client will not send."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = "2025-06-18"


class RawServer:
    """`node mcp-server/dist/index.js` over pipes: write any line, collect every answer by id."""

    def __init__(self, repo_root: Path, entry: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["node", str(entry)],
            cwd=repo_root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.answers: dict[Any, dict[str, Any]] = {}
        self.stdout_lines: list[bytes] = []
        self._arrived: queue.Queue[None] = queue.Queue()
        self._lock = threading.Lock()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()
        answer = self.wait(
            self.request(
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "raw-frames-test", "version": "0"},
                },
            ),
            timeout=60,
        )
        assert "result" in answer, answer
        self.send_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.stdout_lines.append(line)
            message = json.loads(line)  # stdout carries protocol only: anything else fails here
            with self._lock:
                self.answers[message.get("id")] = message
            self._arrived.put(None)

    def send_line(self, line: str) -> None:
        """Write one frame as it is."""
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode("utf-8", "surrogatepass") + b"\n")
        self.process.stdin.flush()

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def request(self, method: str, params: dict[str, Any] | None) -> int:
        """Send a request with a fresh id; returns the id."""
        request_id = self.next_id()
        self.send_line(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
        return request_id

    def call_tool(self, name: str, arguments: dict[str, Any]) -> int:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def wait(self, request_id: Any, timeout: float) -> dict[str, Any]:
        """The answer to request_id; TimeoutError if none came within timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if request_id in self.answers:
                    return self.answers.pop(request_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                msg = f"no answer to {request_id!r} within {timeout} s"
                raise TimeoutError(msg)
            with contextlib.suppress(queue.Empty):
                self._arrived.get(timeout=min(remaining, 0.1))

    def tool_body(self, request_id: int, timeout: float) -> tuple[bool, dict[str, Any]]:
        """(isError, the JSON text content) of a tools/call answer."""
        answer = self.wait(request_id, timeout)
        assert "result" in answer, answer
        result = answer["result"]
        return bool(result.get("isError")), json.loads(result["content"][0]["text"])

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
