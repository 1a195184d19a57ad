"""Driving the real Node server in the fuzz suite: the official client from sync code, and raw frames."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import queue
import subprocess
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, Tool

T = TypeVar("T")

WORKER_STARTED = "started worker pid"  # the front end's stderr line for each worker process it starts


class ClientThread:
    """The official MCP client on an event loop of its own thread, so sync (Hypothesis) code can call tools.

    Lines on the server's stdout that are not JSON-RPC reach the client as exceptions: they are kept in
    `stray_output` for the test to check.
    """

    def __init__(self, params: StdioServerParameters, stderr: TextIO) -> None:
        self.stray_output: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._ready: concurrent.futures.Future[ClientSession] = concurrent.futures.Future()
        self._closing = asyncio.Event()
        # The client's task groups must be entered and left by one task: _serve holds them open.
        self._served = asyncio.run_coroutine_threadsafe(self._serve(params, stderr), self._loop)
        self.session = self._ready.result(timeout=180)

    async def _serve(self, params: StdioServerParameters, stderr: TextIO) -> None:
        try:
            async with (
                stdio_client(params, errlog=stderr) as (read, write),
                ClientSession(read, write, message_handler=self._on_message) as session,
            ):
                with anyio.fail_after(180):
                    await session.initialize()
                self._ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.stray_output.append(repr(message))

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run a coroutine on the client's loop; TimeoutError after `timeout` seconds."""

        async def bounded() -> T:
            with anyio.fail_after(timeout):
                return await coroutine

        return asyncio.run_coroutine_threadsafe(bounded(), self._loop).result()

    def list_tools(self) -> list[Tool]:
        return self.run(self.session.list_tools(), timeout=30).tools

    def call_tool(self, name: str, arguments: dict[str, Any], timeout: float) -> CallToolResult:
        return self.run(self.session.call_tool(name, arguments), timeout=timeout)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._closing.set)
        try:
            self._served.result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


class RawServer:
    """The Node server on pipes: frames are written as given, every stdout line is kept."""

    def __init__(self, server_entry: Path, cwd: Path, env: dict[str, str], stderr_path: Path) -> None:
        self._stderr = stderr_path.open("w")
        self.process = subprocess.Popen(
            ["node", str(server_entry)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self.lines: list[bytes] = []
        self._messages: queue.Queue[Any] = queue.Queue()
        self._answers: dict[str, dict[str, Any]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            try:
                self._messages.put(json.loads(line))
            except ValueError:
                continue  # kept in self.lines; non_protocol_lines() reports it

    def write(self, frame: bytes) -> None:
        """One frame, newline-terminated, exactly as given (a server that has exited gets nothing)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(frame + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the server exited: the test's alive checks report it

    def wait_for(self, request_id: Any, timeout: float) -> dict[str, Any] | None:
        """The response with this id (compared by JSON form), or None if none came in time."""
        key = json.dumps(request_id)
        deadline = time.monotonic() + timeout
        while key not in self._answers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                message = self._messages.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                if self.process.poll() is not None:
                    return None  # the server exited: nothing more will come
                continue
            for item in message if isinstance(message, list) else [message]:
                if isinstance(item, dict) and "id" in item and ("result" in item or "error" in item):
                    self._answers[json.dumps(item["id"])] = item
        return self._answers.pop(key)

    def non_protocol_lines(self) -> list[bytes]:
        """stdout lines that are not JSON-RPC 2.0 messages."""
        stray = []
        for line in self.lines:
            try:
                message = json.loads(line)
            except ValueError:
                stray.append(line)
                continue
            items = message if isinstance(message, list) else [message]
            if not all(isinstance(i, dict) and i.get("jsonrpc") == "2.0" for i in items):
                stray.append(line)
        return stray

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._stderr.close()


def result_json(result: CallToolResult) -> dict[str, Any]:
    """A tool result as JSON: structuredContent on success, else the error object the text content carries.

    (A technique tool's text content is its answer and sources for the model, not JSON.)
    """
    if not result.isError and result.structuredContent is not None:
        return result.structuredContent
    text = "".join(c.text for c in result.content if c.type == "text")
    body: dict[str, Any] = json.loads(text)
    return body
