import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";

import { RateLimiter, type Principal } from "../auth.js";
import type { WorkerBridge } from "../bridge.js";
import { BridgeError } from "../errors.js";
import { listedAnnotations, listedInputSchema, listedOutputSchema } from "../listing.js";
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
  it("lists each tool's public fields as listing.ts shows them, without the bridge routing", async () => {
    const { bridge } = fakeBridge({ describe: describeResult });
    const tools = await new ToolRouter(bridge, realToolSpecs()).listTools();
    const specs = realToolSpecs();
    assert.deepEqual(
      tools.map((tool) => tool.name),
      specs.map((spec) => spec.name),
    );
    for (const [index, tool] of tools.entries()) {
      const { name, title, description, inputSchema, outputSchema, annotations } = specs[index]!;
      assert.deepEqual(tool, {
        name,
        title,
        description,
        inputSchema: listedInputSchema(inputSchema),
        outputSchema: listedOutputSchema(outputSchema),
        annotations: listedAnnotations(annotations!),
      });
    }
  });

  it("forwards a technique tool as execute {technique, arguments} and returns the answer as text plus structuredContent", async () => {
    const answer = { success: true, technique: "basic", answer: "42", retrieved_documents: [] };
    const { bridge, calls } = fakeBridge({ describe: describeResult, execute: () => answer });
    const args = { query: "What?", options: { top_k: 2 } };
    const result = await new ToolRouter(bridge, realToolSpecs()).callTool("rag_basic", args);
    assert.equal(result.isError, undefined);
    assert.deepEqual(result.structuredContent, answer);
    assert.match((result.content[0] as { text: string }).text, /^42\n\nPassages \(basic, /);
    assert.deepEqual(calls.at(-1), { method: "execute", params: { technique: "basic", arguments: args } });
  });

  it("forwards other tools to their bridge method with the arguments as params", async () => {
    const { bridge, calls } = fakeBridge({ describe: describeResult, list_collections: () => ({ collections: [], default_collection: "default" }) });
    const result = await new ToolRouter(bridge, realToolSpecs()).callTool("rag_list_collections", {});
    assert.deepEqual(result.structuredContent, { collections: [], default_collection: "default" });
    assert.deepEqual(calls.at(-1), { method: "list_collections", params: {} });
  });

  it("rejects invalid arguments without forwarding them, and records the rejected call", async () => {
    const { bridge, calls } = fakeBridge({ describe: describeResult, record_call: () => ({}) });
    const result = await new ToolRouter(bridge, realToolSpecs()).callTool("rag_basic", { query: "ok", options: { top_k: 0 } });
    assert.equal(result.isError, true);
    const body = parseText(result);
    assert.equal(body.error.code, "INVALID_PARAMETERS");
    assert.match(body.error.message, /top_k/);
    assert.equal(typeof body.hint, "string");
    assert.deepEqual(
      calls.map((call) => call.method),
      ["record_call"],
    );
    assert.deepEqual({ ...calls[0]!.params, duration_ms: 0 }, {
      tool: "rag_basic",
      technique: "basic",
      duration_ms: 0,
      success: false,
      error_code: "INVALID_PARAMETERS",
    });
  });

  it("echoes request_id and session_id on the front end's own refusals and records the call with them", async () => {
    const { bridge, calls } = fakeBridge({ describe: describeResult, record_call: () => ({}) });
    const ids = { request_id: "r-1", session_id: "s-1" };
    const result = await new ToolRouter(bridge, realToolSpecs()).callTool("rag_basic", { ...ids, options: {} });
    const body = parseText(result);
    assert.equal(body.error.code, "MISSING_REQUIRED_FIELD");
    assert.equal(body.error.details.request_id, "r-1");
    assert.equal(body.error.details.session_id, "s-1");
    assert.equal(calls[0]!.params.request_id, "r-1");
    assert.equal(calls[0]!.params.session_id, "s-1");
    // A worker failure with a partial result: the ids reach structuredContent too.
    const partial = { success: false, technique: "basic", retrieved_documents: [] };
    const failing = fakeBridge({
      describe: describeResult,
      execute: () => {
        throw new BridgeError("LLM_SERVICE_UNAVAILABLE", "llm down", { partial_result: partial });
      },
    });
    const failed = await new ToolRouter(failing.bridge, realToolSpecs()).callTool("rag_basic", { query: "q", ...ids });
    assert.deepEqual(failed.structuredContent, { ...partial, ...ids });
    assert.equal(parseText(failed).error.code, "LLM_SERVICE_UNAVAILABLE");
  });

  it("answers an unknown tool with the protocol error -32602 (MCP 2025-06-18), not a tool result", async () => {
    const { bridge } = fakeBridge({ describe: describeResult });
    await assert.rejects(new ToolRouter(bridge, realToolSpecs()).callTool("rag_nope", {}), (error: unknown) => {
      assert.ok(error instanceof McpError);
      assert.equal(error.code, ErrorCode.InvalidParams);
      assert.match(error.message, /Unknown tool: rag_nope; available tools: .*rag_basic/);
      return true;
    });
  });

  it("turns a worker error into an isError result and keeps a partial_result as structuredContent", async () => {
    const partial = { success: false, technique: "basic", answer: null, retrieved_documents: [] };
    const { bridge } = fakeBridge({
      describe: describeResult,
      execute: () => {
        throw new BridgeError("GENERATION_FAILED", "llm down", { partial_result: partial });
      },
    });
    const result = await new ToolRouter(bridge, realToolSpecs()).callTool("rag_basic", { query: "q" });
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
    const result = await new ToolRouter(bridge, realToolSpecs()).callTool("rag_health_check", {});
    assert.equal(result.isError, undefined);
    const health = result.structuredContent as Record<string, any>;
    assert.equal(health.status, "unhealthy");
    assert.equal(health.components.python_bridge.status, "unhealthy");
    assert.match(health.components.python_bridge.error_message, /WORKER_CRASHED.*SIGKILL/);
  });

  it("lists the tools without the worker", async () => {
    const { bridge, calls } = fakeBridge({});
    assert.equal(new ToolRouter(bridge, realToolSpecs()).listTools().length, realToolSpecs().length);
    assert.deepEqual(calls, []);
  });

  it("records an unknown tool's call under one name, not the client's", async () => {
    const { bridge, calls } = fakeBridge({ record_call: () => ({}) });
    const router = new ToolRouter(bridge, realToolSpecs());
    await assert.rejects(router.callTool("rag_nope", {}), McpError);
    await assert.rejects(router.callTool("rag_other_nope", {}), McpError);
    assert.deepEqual(
      calls.map(({ method, params }) => [method, params.tool, params.error_code]),
      [
        ["record_call", "(unknown tool)", "PIPELINE_NOT_FOUND"],
        ["record_call", "(unknown tool)", "PIPELINE_NOT_FOUND"],
      ],
    );
  });

  it("spends the key's rate on every tools/call, unknown and forbidden ones included", async () => {
    const { bridge, calls } = fakeBridge({ record_call: () => ({}) });
    const router = new ToolRouter(bridge, realToolSpecs(), undefined, new RateLimiter(() => 0));
    const reader: Principal = { id: "r", scopes: ["read"], collections: "*", requestsPerMinute: 2 };
    await assert.rejects(router.callTool("rag_nope", {}, undefined, reader), McpError);
    const forbidden = await router.callTool("rag_ingest", {}, undefined, reader);
    assert.equal(parseText(forbidden).error.code, "FORBIDDEN");
    // The bucket (2 a minute) is empty: neither a name that is no tool nor a forbidden tool goes past it.
    // A name that is no tool is still the protocol error it always is (MCP), recorded as over the rate.
    await assert.rejects(router.callTool("rag_nope", {}, undefined, reader), (error: unknown) =>
      error instanceof McpError && error.code === ErrorCode.InvalidParams && /Unknown tool: rag_nope/.test(error.message));
    const limited = await router.callTool("rag_ingest", {}, undefined, reader);
    assert.equal(parseText(limited).error.code, "RATE_LIMIT_EXCEEDED");
    assert.deepEqual(
      calls.map(({ params }) => [params.tool, params.error_code]),
      [
        ["(unknown tool)", "PIPELINE_NOT_FOUND"],
        ["rag_ingest", "FORBIDDEN"],
        ["(unknown tool)", "RATE_LIMIT_EXCEEDED"],
        ["rag_ingest", "RATE_LIMIT_EXCEEDED"],
      ],
    );
  });

  it("answers GET /health's probe from the worker's unrecorded probe_health, unhealthy when it cannot", async () => {
    const healthy = { status: "healthy", timestamp: "t", components: {} };
    const { bridge, calls } = fakeBridge({ probe_health: () => healthy, record_call: () => ({}) });
    assert.deepEqual((await new ToolRouter(bridge, realToolSpecs()).probeHealth()).structuredContent, healthy);
    assert.deepEqual(calls, [{ method: "probe_health", params: { include_details: false } }]);
    const down = fakeBridge({ probe_health: () => { throw new BridgeError("WORKER_UNAVAILABLE", "no python"); } });
    const answer = (await new ToolRouter(down.bridge, realToolSpecs()).probeHealth()).structuredContent;
    assert.equal(answer?.status, "unhealthy");
    assert.deepEqual(down.calls.map((call) => call.method), ["probe_health"]);
  });

  it("records a time-out or cancel only when the worker never got the call", async () => {
    const failures = [
      new BridgeError("TIMEOUT_EXCEEDED", "slow", { stage: "queued" }),
      new BridgeError("TIMEOUT_EXCEEDED", "slow", { stage: "running" }),
      new BridgeError("REQUEST_CANCELLED", "cancelled", { stage: "queued" }),
      new BridgeError("REQUEST_CANCELLED", "cancelled", { stage: "running" }),
      new BridgeError("RATE_LIMIT_EXCEEDED", "full"),
    ];
    const { bridge, calls } = fakeBridge({
      execute: () => {
        throw failures.shift();
      },
      record_call: () => ({}),
    });
    const router = new ToolRouter(bridge, realToolSpecs());
    for (let i = 0; i < 5; i++) await router.callTool("rag_basic", { query: "q" });
    assert.deepEqual(
      calls.filter((call) => call.method === "record_call").map((call) => call.params.error_code),
      ["TIMEOUT_EXCEEDED", "REQUEST_CANCELLED", "RATE_LIMIT_EXCEEDED"],
    );
  });

  it("rejects text with a lone surrogate and JSON nested too deep, without forwarding them", async () => {
    const { bridge, calls } = fakeBridge({ record_call: () => ({}) });
    const router = new ToolRouter(bridge, realToolSpecs());
    const surrogate = parseText(await router.callTool("rag_basic", { query: "insulin \ud800 x" }));
    assert.equal(surrogate.error.code, "INVALID_QUERY");
    assert.match(surrogate.error.message, /lone UTF-16 surrogate/);
    const inFilter = parseText(await router.callTool("rag_basic", { query: "q", options: { filters: { f: "\udc00" } } }));
    assert.equal(inFilter.error.code, "INVALID_PARAMETERS");
    let metadata: Record<string, unknown> = {};
    for (let i = 0; i < 5_000; i++) metadata = { m: metadata };
    const deep = parseText(await router.callTool("rag_ingest", { collection_id: "c", documents: [{ content: "x", metadata }] }));
    assert.equal(deep.error.code, "INVALID_PARAMETERS");
    assert.match(deep.error.message, /nested more than/);
    let shallow: Record<string, unknown> = {};
    for (let i = 0; i < 20; i++) shallow = { m: shallow };
    const bounded = parseText(await router.callTool("rag_ingest", { collection_id: "c", documents: [{ content: "x", metadata: shallow }] }));
    assert.match(bounded.error.message, /metadata must not be nested more than 16 levels deep/);
    assert.deepEqual(
      calls.map((call) => call.method),
      ["record_call", "record_call", "record_call", "record_call"],
    );
  });
});
