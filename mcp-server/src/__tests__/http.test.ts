import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import { Server } from "@modelcontextprotocol/sdk/server/index.js";

import { RateLimiter } from "../auth.js";
import type { HttpConfig } from "../config.js";
import { HttpFrontDoor } from "../http.js";
import type { IrisRagServer } from "../server.js";

const hash = (key: string) => createHash("sha256").update(key).digest("hex");

/** A front door on a free loopback port over MCP servers with no worker (initialize and ping need none). */
async function frontDoor(principals: unknown[], maxSessionsPerKey: number): Promise<{ door: HttpFrontDoor; url: string }> {
  const authFile = join(mkdtempSync(join(tmpdir(), "iris-rag-http-")), "principals.json");
  writeFileSync(authFile, JSON.stringify({ principals }));
  const core = {
    limiter: new RateLimiter(),
    newServer: () => new Server({ name: "t", version: "0" }, { capabilities: {} }),
  } as unknown as IrisRagServer;
  const config: HttpConfig = { host: "127.0.0.1", port: 0, authFile, allowedOrigins: [], maxBodyBytes: 1 << 20, sessionIdleMs: 60_000, maxSessionsPerKey };
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
});
