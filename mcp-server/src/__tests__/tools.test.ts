import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { WorkerBridge } from "../bridge.js";
import { BridgeError } from "../errors.js";
import { ToolRouter } from "../tools.js";
import { realToolSpecs } from "./helpers.js";

type Handler = (params: Record<string, unknown>) => unknown;

/** A bridge double: records every request and answers from `handlers` (a thrown BridgeError rejects). */
function fakeBridge(handlers: Record<string, Handler>) {
  const calls: Array<{ method: string; params: Record<string, unknown> }> = [];
  const bridge = {
    async request(method: string, params: Record<string, unknown> = {}) {
      calls.push({ method, params });
      const handler = handlers[method];
      if (!handler) throw new BridgeError("METHOD_NOT_FOUND", `no ${method}`);
      return handler(params);
    },
  };
  return { calls, bridge: bridge as unknown as WorkerBridge };
}

const describeResult = () => ({ server: { name: "iris-rag", version: "0.1.0" }, tools: realToolSpecs() });
const parseText = (result: { content: unknown[] }) => JSON.parse((result.content[0] as { text: string }).text) as Record<string, any>;

describe("ToolRouter", () => {
  it("lists each tool's public fields exactly as described, without the bridge routing", async () => {
    const { bridge } = fakeBridge({ describe: describeResult });
    const tools = await new ToolRouter(bridge, 1000).listTools();
    const specs = realToolSpecs();
    assert.deepEqual(
      tools.map((tool) => tool.name),
      specs.map((spec) => spec.name),
    );
    for (const [index, tool] of tools.entries()) {
      const { bridge: _routing, ...expected } = specs[index]!;
      assert.deepEqual(tool, expected);
    }
  });

  it("forwards a technique tool as execute {technique, arguments} and returns text plus structuredContent", async () => {
    const answer = { success: true, technique: "basic", answer: "42" };
    const { bridge, calls } = fakeBridge({ describe: describeResult, execute: () => answer });
    const args = { query: "What?", options: { top_k: 2 } };
    const result = await new ToolRouter(bridge, 1000).callTool("rag_basic", args);
    assert.equal(result.isError, undefined);
    assert.deepEqual(result.structuredContent, answer);
    assert.deepEqual(parseText(result), answer);
    assert.deepEqual(calls.at(-1), { method: "execute", params: { technique: "basic", arguments: args } });
  });

  it("forwards other tools to their bridge method with the arguments as params", async () => {
    const { bridge, calls } = fakeBridge({ describe: describeResult, list_collections: () => ({ collections: [], default_collection: "default" }) });
    const result = await new ToolRouter(bridge, 1000).callTool("rag_list_collections", {});
    assert.deepEqual(result.structuredContent, { collections: [], default_collection: "default" });
    assert.deepEqual(calls.at(-1), { method: "list_collections", params: {} });
  });

  it("rejects invalid arguments without forwarding them, and records the rejected call", async () => {
    const { bridge, calls } = fakeBridge({ describe: describeResult, record_call: () => ({}) });
    const result = await new ToolRouter(bridge, 1000).callTool("rag_basic", { query: "ok", options: { top_k: 0 } });
    assert.equal(result.isError, true);
    const body = parseText(result);
    assert.equal(body.error.code, "INVALID_PARAMETERS");
    assert.match(body.error.message, /top_k/);
    assert.equal(typeof body.hint, "string");
    assert.deepEqual(
      calls.map((call) => call.method),
      ["describe", "record_call"],
    );
    assert.deepEqual({ ...calls[1]!.params, duration_ms: 0 }, {
      tool: "rag_basic",
      technique: "basic",
      duration_ms: 0,
      success: false,
      error_code: "INVALID_PARAMETERS",
    });
  });

  it("answers an unknown tool with PIPELINE_NOT_FOUND", async () => {
    const { bridge } = fakeBridge({ describe: describeResult });
    const result = await new ToolRouter(bridge, 1000).callTool("rag_nope", {});
    assert.equal(result.isError, true);
    assert.equal(parseText(result).error.code, "PIPELINE_NOT_FOUND");
  });

  it("turns a worker error into an isError result and keeps a partial_result as structuredContent", async () => {
    const partial = { success: false, technique: "basic", answer: null, retrieved_documents: [] };
    const { bridge } = fakeBridge({
      describe: describeResult,
      execute: () => {
        throw new BridgeError("GENERATION_FAILED", "llm down", { partial_result: partial });
      },
    });
    const result = await new ToolRouter(bridge, 1000).callTool("rag_basic", { query: "q" });
    assert.equal(result.isError, true);
    assert.deepEqual(result.structuredContent, partial);
    const body = parseText(result);
    assert.equal(body.success, false);
    assert.equal(body.error.code, "GENERATION_FAILED");
    assert.match(body.hint, /generate=false/);
  });

  it("reports an unreachable worker as an unhealthy health check instead of failing", async () => {
    const { bridge } = fakeBridge({
      describe: describeResult,
      health_check: () => {
        throw new BridgeError("WORKER_CRASHED", "The Python worker was killed by SIGKILL");
      },
    });
    const result = await new ToolRouter(bridge, 1000).callTool("rag_health_check", {});
    assert.equal(result.isError, undefined);
    const health = result.structuredContent as Record<string, any>;
    assert.equal(health.status, "unhealthy");
    assert.equal(health.components.python_bridge.status, "unhealthy");
    assert.match(health.components.python_bridge.error_message, /WORKER_CRASHED.*SIGKILL/);
  });

  it("retries describe after a failed load", async () => {
    let attempts = 0;
    const { bridge } = fakeBridge({
      describe: () => {
        if (++attempts === 1) throw new BridgeError("TIMEOUT_EXCEEDED", "slow start");
        return describeResult();
      },
    });
    const router = new ToolRouter(bridge, 1000);
    await assert.rejects(router.listTools(), { code: "TIMEOUT_EXCEEDED" });
    assert.equal((await router.listTools()).length, realToolSpecs().length);
  });
});
