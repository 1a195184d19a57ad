import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { setTimeout as delay } from "node:timers/promises";

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { CallToolRequestSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import { RateLimiter } from "../auth.js";
import type { HttpConfig } from "../config.js";
import { HttpFrontDoor } from "../http.js";
import type { IrisRagServer } from "../server.js";

const hash = (key: string) => createHash("sha256").update(key).digest("hex");

/** A front door on a free loopback port over MCP servers with no worker (initialize and ping need none). */
async function frontDoor(
  principals: unknown[],
  maxSessionsPerKey: number,
  newServer = () => new Server({ name: "t", version: "0" }, { capabilities: {} }),
  sessionIdleMs = 60_000,
): Promise<{ door: HttpFrontDoor; url: string }> {
  const authFile = join(mkdtempSync(join(tmpdir(), "iris-rag-http-")), "principals.json");
  writeFileSync(authFile, JSON.stringify({ principals }));
  const core = { limiter: new RateLimiter(), newServer } as unknown as IrisRagServer;
  const config: HttpConfig = { host: "127.0.0.1", port: 0, authFile, allowedOrigins: [], maxBodyBytes: 1 << 20, sessionIdleMs, maxSessionsPerKey };
  const door = new HttpFrontDoor(core, config);
  const { port } = await door.listen();
  return { door, url: `http://127.0.0.1:${port}/mcp` };
}

const HEADERS = { "content-type": "application/json", accept: "application/json, text/event-stream" };
const initialize = (id: number) => ({ jsonrpc: "2.0", id, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "0" } } });

async function post(url: string, key: string, body: unknown, session?: string) {
  const response = await fetch(url, { method: "POST", headers: { ...HEADERS, authorization: `Bearer ${key}`, ...(session && { "mcp-session-id": session }) }, body: JSON.stringify(body) });
  const text = await response.text();
  return { status: response.status, headers: response.headers, session: response.headers.get("mcp-session-id"), text };
}

describe("HTTP front door: what a key may spend", () => {
  const doors: HttpFrontDoor[] = [];
  after(() => Promise.all(doors.map((door) => door.close())));

  it("caps the live sessions of a key by closing its least recently used one", async () => {
    const { door, url } = await frontDoor(
      [
        { id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" },
        { id: "b", key_sha256: hash("kb"), scopes: ["read"], collections: "*" },
      ],
      2,
    );
    doors.push(door);
    const ping = async (key: string, session: string) => (await post(url, key, { jsonrpc: "2.0", id: 5, method: "ping" }, session)).status;
    const other = await post(url, "kb", initialize(1));
    const first = await post(url, "ka", initialize(1));
    const second = await post(url, "ka", initialize(2));
    assert.equal(await ping("ka", first.session!), 200, "the first is now used after the second");
    const third = await post(url, "ka", initialize(3));
    assert.equal(third.status, 200);
    assert.deepEqual([await ping("ka", second.session!), await ping("ka", first.session!), await ping("ka", third.session!)], [404, 200, 200]);
    assert.equal(await ping("kb", other.session!), 200, "the cap is per key");
  });

  it("closes no idle session for an initialize the transport refuses, only once a new session is open", async () => {
    const { door, url } = await frontDoor([{ id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" }], 1);
    doors.push(door);
    const ping = async (session: string) => (await post(url, "ka", { jsonrpc: "2.0", id: 5, method: "ping" }, session)).status;
    const idle = await post(url, "ka", initialize(1));
    const headers = { ...HEADERS, authorization: "Bearer ka", accept: "application/json" };
    const refused = await fetch(url, { method: "POST", headers, body: JSON.stringify(initialize(2)) });
    await refused.text();
    assert.equal(refused.status, 406);
    assert.equal(await ping(idle.session!), 200, "the refused initialize closed nothing");
    const opened = await post(url, "ka", initialize(3));
    assert.equal(opened.status, 200, opened.text);
    assert.deepEqual([await ping(idle.session!), await ping(opened.session!)], [404, 200]);
  });

  it("two initializes at once past the cap with one idle session: the key still holds one session", async () => {
    const { door, url } = await frontDoor([{ id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" }], 1);
    doors.push(door);
    const idle = await post(url, "ka", initialize(1));
    // At once, one of them is refused (429); one after the other, the second closes the first.
    const both = await Promise.all([post(url, "ka", initialize(2)), post(url, "ka", initialize(3))]);
    assert.ok(both.some((answer) => answer.status === 200));
    const ping = async (session: string | null) => (session ? (await post(url, "ka", { jsonrpc: "2.0", id: 5, method: "ping" }, session)).status : 404);
    const statuses = [await ping(idle.session), ...(await Promise.all(both.map((answer) => ping(answer.session))))];
    assert.equal(statuses.filter((status) => status === 200).length, 1, `pings: ${statuses.join(", ")}`);
  });

  it("keeps no MCP server for an initialize the transport refuses (406, 415)", async () => {
    // What server.ts keeps per server (its `live` set): created and not yet closed.
    let live = 0;
    const counted = () => {
      const server = new Server({ name: "t", version: "0" }, { capabilities: {} });
      live++;
      server.onclose = () => live--;
      return server;
    };
    const { door, url } = await frontDoor([{ id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" }], 2, counted);
    doors.push(door);
    const refusals = [
      { accept: "application/json" },
      { "content-type": "text/plain" },
    ];
    const statuses = new Set<number>();
    for (let id = 1; id <= 20; id++) {
      const headers = { ...HEADERS, authorization: "Bearer ka", ...refusals[id % 2] };
      const response = await fetch(url, { method: "POST", headers, body: JSON.stringify(initialize(id)) });
      await response.text();
      statuses.add(response.status);
    }
    assert.deepEqual([...statuses].sort(), [406, 415]);
    assert.equal(live, 0, "every refused initialize's server is closed");
    const first = await post(url, "ka", initialize(30));
    const second = await post(url, "ka", initialize(31));
    assert.deepEqual([first.status, second.status], [200, 200], "refused initializes take none of the key's sessions");
    assert.equal(live, 2);
  });

  it("spends a token per initialize, but not per ping", async () => {
    const { door, url } = await frontDoor([{ id: "lim", key_sha256: hash("kl"), scopes: ["read"], collections: "*", requests_per_minute: 2 }], 32);
    doors.push(door);
    const first = await post(url, "kl", initialize(1));
    assert.equal(first.status, 200);
    assert.equal((await post(url, "kl", initialize(2))).status, 200);
    const refused = await post(url, "kl", initialize(3));
    assert.equal(refused.status, 429);
    assert.match(refused.text, /RATE_LIMIT_EXCEEDED: More than 2 requests per minute/);
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    for (let id = 10; id < 15; id++) {
      const ping = await post(url, "kl", { jsonrpc: "2.0", id, method: "ping" }, first.session!);
      assert.equal(ping.status, 200, ping.text);
    }
  });

  it("names a progressToken that is an object, not a JSON-RPC parse error", async () => {
    const { door, url } = await frontDoor([{ id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" }], 32);
    doors.push(door);
    const { session } = await post(url, "ka", initialize(1));
    const call = { jsonrpc: "2.0", id: 9, method: "tools/call", params: { name: "rag_list_collections", arguments: {}, _meta: { progressToken: { x: 1 } } } };
    const answer = await post(url, "ka", call, session!);
    assert.equal(answer.status, 400);
    assert.deepEqual(JSON.parse(answer.text), {
      jsonrpc: "2.0",
      id: 9,
      error: { code: -32602, message: "Invalid params: params._meta.progressToken must be a string or an integer, not an object" },
    });
  });

  it("answers params that fail the method's schema with -32602 in one line, as on stdio", async () => {
    const { door, url } = await frontDoor([{ id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" }], 32);
    doors.push(door);
    const { session } = await post(url, "ka", initialize(1));
    const answer = await post(url, "ka", { jsonrpc: "2.0", id: 10, method: "resources/read", params: {} }, session!);
    assert.equal(answer.status, 400);
    const { error } = JSON.parse(answer.text) as { error: { code: number; message: string } };
    assert.equal(error.code, -32602);
    assert.match(error.message, /^Invalid params: resources\/read params\.uri: Invalid input: expected string[^\n]*$/);
  });
});

/**
 * Tools with no worker: `wait` runs until its call is cancelled (then the SDK sends no response) or the
 * `release` below ends it with an error result, as stopping the worker does; `quick` answers after 100 ms;
 * `stuck` never answers.
 */
function toolServers(): { newServer: () => Server; release: () => void } {
  const waiting = new Set<() => void>();
  const newServer = () => {
    const server = new Server({ name: "t", version: "0" }, { capabilities: { tools: {} } });
    server.setRequestHandler(CallToolRequestSchema, async (request, extra): Promise<CallToolResult> => {
      const { name } = request.params;
      if (name === "quick") await new Promise((resolve) => setTimeout(resolve, 100));
      if (name === "stuck") await new Promise(() => undefined);
      if (name === "wait") {
        await new Promise<void>((resolve) => {
          waiting.add(resolve);
          extra.signal.addEventListener("abort", () => resolve());
        });
      }
      return { content: [{ type: "text", text: name === "wait" ? "REQUEST_CANCELLED: shutting down" : "done" }], isError: name === "wait" };
    });
    return server;
  };
  const release = () => {
    for (const resolve of waiting) resolve();
    waiting.clear();
  };
  return { newServer, release };
}

const toolCall = (id: number, name: string) => ({ jsonrpc: "2.0", id, method: "tools/call", params: { name, arguments: {} } });
const cancelled = (requestId: number) => ({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId, reason: "test" } });

/** POST a body; `text` settles when the server ends the response's stream. */
async function open(url: string, key: string, body: unknown, session: string): Promise<{ text: Promise<string> }> {
  const response = await fetch(url, {
    method: "POST",
    headers: { ...HEADERS, authorization: `Bearer ${key}`, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18" },
    body: JSON.stringify(body),
  });
  assert.equal(response.status, 200);
  return { text: response.text() };
}

/** The JSON-RPC messages of an SSE body. */
const events = (text: string): Array<Record<string, unknown>> =>
  text
    .split("\n")
    .filter((line) => line.startsWith("data: "))
    .map((line) => JSON.parse(line.slice(6)) as Record<string, unknown>);

const within = <T>(promise: Promise<T>, ms: number, what: string): Promise<T> =>
  Promise.race([promise, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms).unref())]);

describe("HTTP front door: streams of cancelled calls, and shutdown", () => {
  const key = { id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" };

  it("ends the stream of a cancelled call without a response, and a batch's once its other calls are answered", async (t) => {
    const { newServer } = toolServers();
    const { door, url } = await frontDoor([key], 32, newServer);
    t.after(() => door.close());
    const { session } = await post(url, "ka", initialize(1));
    const alone = await open(url, "ka", toolCall(2, "wait"), session!);
    const batch = await open(url, "ka", [toolCall(3, "wait"), toolCall(4, "quick")], session!);
    for (const id of [2, 3]) assert.equal((await post(url, "ka", cancelled(id), session!)).status, 202);
    assert.deepEqual(events(await within(alone.text, 3_000, "the cancelled call's stream")), []);
    const answered = events(await within(batch.text, 3_000, "the batch's stream"));
    assert.deepEqual(answered.map((message) => message.id), [4]);
    assert.equal((await post(url, "ka", { jsonrpc: "2.0", id: 5, method: "ping" }, session!)).status, 200);
  });

  it("answers the calls in progress before it closes their streams, an error for one that never ends", async () => {
    const { newServer, release } = toolServers();
    const { door, url } = await frontDoor([key], 32, newServer);
    const { session } = await post(url, "ka", initialize(1));
    const running = await open(url, "ka", toolCall(2, "wait"), session!);
    const stuck = await open(url, "ka", toolCall(3, "stuck"), session!);
    let stopped = false;
    const closed = door.close(async () => {
      stopped = true;
      release();
    });
    const [answer] = events(await within(running.text, 5_000, "the running call's stream"));
    assert.ok(stopped);
    assert.equal(answer?.id, 2);
    assert.deepEqual(answer?.result, { content: [{ type: "text", text: "REQUEST_CANCELLED: shutting down" }], isError: true });
    const [refusal] = events(await within(stuck.text, 5_000, "the stuck call's stream"));
    assert.equal(refusal?.id, 3);
    assert.match(JSON.stringify(refusal?.error), /shutting down.*REQUEST_CANCELLED/);
    await within(closed, 5_000, "close()");
  });
});

describe("HTTP front door: a session with a call in progress is busy, not idle", () => {
  const key = { id: "a", key_sha256: hash("ka"), scopes: ["read"], collections: "*" };
  const ping = async (url: string, session: string) => (await post(url, "ka", { jsonrpc: "2.0", id: 50, method: "ping" }, session)).status;

  it("past the cap, closes the least recently seen idle session, and refuses a new one when every session is busy", async (t) => {
    const { newServer, release } = toolServers();
    const { door, url } = await frontDoor([key], 2, newServer);
    t.after(() => door.close());
    const busy = await post(url, "ka", initialize(1));
    const running = await open(url, "ka", toolCall(2, "wait"), busy.session!);
    const idle = await post(url, "ka", initialize(3));
    // The busy session was seen first: still, the idle one makes room.
    const third = await post(url, "ka", initialize(4));
    assert.equal(third.status, 200, third.text);
    assert.equal(await ping(url, idle.session!), 404, "the idle session is closed");
    const alsoRunning = await open(url, "ka", toolCall(5, "wait"), third.session!);
    const refused = await post(url, "ka", initialize(6));
    assert.equal(refused.status, 429);
    const { error, id } = JSON.parse(refused.text) as { error: { message: string; data: Record<string, unknown> }; id: unknown };
    assert.equal(id, 6);
    assert.match(error.message, /MCP_MAX_SESSIONS_PER_KEY \(2\).*busy/);
    assert.deepEqual(error.data, { limit: "MCP_MAX_SESSIONS_PER_KEY", max_sessions: 2 });
    release();
    for (const [stream, callId] of [[running, 2], [alsoRunning, 5]] as const) {
      const [answer] = events(await within(stream.text, 3_000, `call ${callId}'s stream`));
      assert.equal(answer?.id, callId, "the busy session's call is answered");
    }
    assert.equal(await ping(url, busy.session!), 200);
    assert.equal((await post(url, "ka", initialize(7))).status, 200, "once a call ends its session is idle again");
  });

  it("the idle sweeper leaves a session with a call in progress, and counts its idle time from the call's end", async (t) => {
    const { newServer, release } = toolServers();
    const { door, url } = await frontDoor([key], 32, newServer, 300);
    t.after(() => door.close());
    const busy = await post(url, "ka", initialize(1));
    const running = await open(url, "ka", toolCall(2, "wait"), busy.session!);
    const idle = await post(url, "ka", initialize(3));
    await delay(1_000);
    assert.equal(await ping(url, idle.session!), 404, "the idle session is closed");
    release();
    const [answer] = events(await within(running.text, 3_000, "the running call's stream"));
    assert.equal(answer?.id, 2, "the busy session's call is answered");
    await delay(150);
    assert.equal(await ping(url, busy.session!), 200, "idle for 150 ms, not since the call arrived");
    await delay(1_000);
    assert.equal(await ping(url, busy.session!), 404, "idle once its call ended");
  });
});
