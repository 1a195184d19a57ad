import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { McpError } from "@modelcontextprotocol/sdk/types.js";

import { RateLimiter, type Principal } from "../auth.js";
import type { WorkerBridge } from "../bridge.js";
import { BridgeError } from "../errors.js";
import { parseResourceUri, ResourceRouter, RESOURCE_TEMPLATES } from "../resources.js";
import { ToolRouter } from "../tools.js";
import { realToolSpecs } from "./helpers.js";

describe("rag://podcast/{name}", () => {
  it("names a podcast by the worker's own names only", () => {
    assert.deepEqual(parseResourceUri("rag://podcast/sci-vitamin-d-20261125-035805-f0ec3f"), { kind: "podcast", name: "sci-vitamin-d-20261125-035805-f0ec3f" });
    // Never a path, an escape, a query or an upper-case name: those are no podcast.
    for (const uri of ["rag://podcast/", "rag://podcast/../x", "rag://podcast/..%2Fx", "rag://podcast/a/b", "rag://podcast/a?x=1", "rag://podcast/Abc", "rag://podcast/-a"]) {
      assert.equal(parseResourceUri(uri), undefined, uri);
    }
  });

  it("is listed as an audio/wav template", () => {
    const template = RESOURCE_TEMPLATES.find((t) => t.uriTemplate === "rag://podcast/{name}");
    assert.equal(template?.mimeType, "audio/wav");
  });
});

/** A bridge double that records each worker request and answers from `handlers`. */
function fakeBridge(handlers: Record<string, (params: Record<string, unknown>) => unknown>) {
  const calls: string[] = [];
  const bridge = {
    async request(method: string, params: Record<string, unknown> = {}) {
      calls.push(method);
      const handler = handlers[method];
      if (!handler) throw new BridgeError("METHOD_NOT_FOUND", `no ${method}`);
      return handler(params);
    },
  };
  return { calls, bridge: bridge as unknown as WorkerBridge };
}

const rejected = async (promise: Promise<unknown>): Promise<McpError> => {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof McpError, String(error));
    return error;
  }
  assert.fail("expected an McpError");
};

describe("rag://collection/{id}/documents{?cursor,limit}", () => {
  it("refuses a limit that is not an integer by name and value, before the worker is asked", async () => {
    const { bridge, calls } = fakeBridge({ list_documents: () => ({ documents: [], next_cursor: null }) });
    const router = new ResourceRouter(bridge);
    for (const limit of ["abc", "", "2.5", "-1", "0x10", "1e2"]) {
      const error = await rejected(router.read(`rag://collection/c/documents?limit=${encodeURIComponent(limit)}`));
      assert.equal(error.code, -32602, limit);
      assert.match(error.message, /query parameter limit/, limit);
      assert.ok(error.message.includes(JSON.stringify(limit)), error.message);
    }
    assert.deepEqual(calls, []);
    assert.deepEqual(parseResourceUri("rag://collection/c/documents?limit=20"), { kind: "documents", collection: "c", limit: 20 });
  });
});

describe("requests_per_minute over resources", () => {
  const principal: Principal = { id: "lim", scopes: ["read"], collections: "*", requestsPerMinute: 3 };

  it("resources/read and resources/list spend from the bucket tools/call empties", async () => {
    const { bridge, calls } = fakeBridge({
      list_collections: () => ({ collections: [{ id: "c" }], default_collection: "c" }),
      record_call: () => ({}),
    });
    const limiter = new RateLimiter();
    const tools = new ToolRouter(bridge, realToolSpecs(), undefined, limiter);
    const resources = new ResourceRouter(bridge, limiter);
    for (let i = 0; i < 3; i++) assert.ok(!(await tools.callTool("rag_list_collections", {}, undefined, principal)).isError);
    const workerCalls = calls.filter((method) => method !== "record_call").length;
    for (const read of [() => resources.read("rag://collections", principal), () => resources.list(principal)]) {
      const error = await rejected(read());
      assert.equal(error.code, -32000);
      assert.match(error.message, /RATE_LIMIT_EXCEEDED: More than 3 requests per minute/);
      assert.ok((error.data as { retry_after_ms: number }).retry_after_ms > 0);
    }
    assert.equal(calls.filter((method) => method !== "record_call").length, workerCalls, "a refused read never reaches the worker");
  });

  it("a read spends a token that a later tools/call then lacks", async () => {
    const { bridge } = fakeBridge({ list_collections: () => ({ collections: [], default_collection: "c" }), record_call: () => ({}) });
    const limiter = new RateLimiter();
    const tools = new ToolRouter(bridge, realToolSpecs(), undefined, limiter);
    const resources = new ResourceRouter(bridge, limiter);
    for (let i = 0; i < 3; i++) await resources.read("rag://collections", principal);
    const result = await tools.callTool("rag_list_collections", {}, undefined, principal);
    assert.equal(result.isError, true);
    assert.match(JSON.stringify(result.content), /RATE_LIMIT_EXCEEDED/);
  });
});
