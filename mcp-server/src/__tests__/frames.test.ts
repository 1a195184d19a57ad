import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { rejectFrame } from "../frames.js";

const frame = (message: unknown) => JSON.stringify(message);

describe("rejectFrame: frames the SDK would drop or answer with a zod dump", () => {
  it("passes well-formed requests and notifications through", () => {
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "rag_basic", arguments: { query: "q" } } })), null);
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: "a", method: "tools/call", params: { name: "rag_basic" } })), null);
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: 1 } })), null);
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: 2, method: "tools/list" })), null);
  });

  it("answers a line that is not JSON with -32700 and a non-object with -32600", () => {
    assert.deepEqual(rejectFrame("{not json")?.code, -32700);
    const batch = rejectFrame('[{"jsonrpc":"2.0","id":"b1","method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"id":3}]');
    assert.deepEqual([batch?.code, batch?.batch], [-32600, ["b1", 3]]);
    assert.deepEqual(rejectFrame("[1]"), { id: null, code: -32600, message: "Invalid Request: a message must be a JSON object, not an array" });
  });

  it("answers params null and non-object arguments with -32602 and the request's id", () => {
    const nullParams = rejectFrame(frame({ jsonrpc: "2.0", id: 7, method: "tools/call", params: null }));
    assert.deepEqual(nullParams, { id: 7, code: -32602, message: "Invalid params: tools/call params must be an object, not null" });
    for (const args of [[], "q", 5, null]) {
      const rejection = rejectFrame(frame({ jsonrpc: "2.0", id: "x", method: "tools/call", params: { name: "rag_basic", arguments: args } }));
      assert.equal(rejection?.id, "x");
      assert.equal(rejection?.code, -32602);
      assert.match(rejection?.message ?? "", /arguments must be a JSON object/);
    }
    assert.match(rejectFrame(frame({ jsonrpc: "2.0", id: 3, method: "tools/call", params: {} }))?.message ?? "", /needs params.name/);
  });

  it("answers a request that is not JSON-RPC 2.0 with -32600", () => {
    assert.equal(rejectFrame(frame({ id: 4, method: "tools/list" }))?.code, -32600);
    assert.deepEqual(rejectFrame(frame({ jsonrpc: "2.0", id: null, method: "tools/list" }))?.id, null);
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: { a: 1 }, method: "tools/list" }))?.code, -32600);
  });

  it("names a bad _meta.progressToken instead of claiming jsonrpc, method or id are missing", () => {
    const call = (meta: unknown) => frame({ jsonrpc: "2.0", id: 5, method: "tools/call", params: { name: "rag_list_collections", arguments: {}, _meta: meta } });
    for (const [token, shown] of [[{ x: 1 }, "an object"], [[1], "an array"], [null, "null"], [true, "a boolean"], [1.5, "1.5"]] as const) {
      assert.deepEqual(rejectFrame(call({ progressToken: token })), {
        id: 5,
        code: -32602,
        message: `Invalid params: params._meta.progressToken must be a string or an integer, not ${shown}`,
      });
    }
    assert.deepEqual(rejectFrame(call("tok"))?.message, "Invalid params: params._meta must be an object, not a string");
    assert.equal(rejectFrame(call({ progressToken: "t" })), null);
    assert.equal(rejectFrame(call({ progressToken: 7 })), null);
  });

  it("answers params that fail any method's schema with -32602 in one line, not the SDK's -32603 zod dump", () => {
    const cases: Array<[string, unknown, string]> = [
      ["resources/read", {}, "params.uri"],
      ["resources/read", { uri: 5 }, "params.uri"],
      ["tools/list", { cursor: 5 }, "params.cursor"],
      ["resources/list", { cursor: {} }, "params.cursor"],
      ["initialize", {}, "params.protocolVersion"],
    ];
    for (const [method, params, named] of cases) {
      const rejection = rejectFrame(frame({ jsonrpc: "2.0", id: 8, method, params }));
      assert.equal(rejection?.code, -32602, method);
      assert.equal(rejection?.id, 8);
      assert.match(rejection?.message ?? "", new RegExp(`^Invalid params: ${method} ${named}: Invalid input: expected `));
      assert.doesNotMatch(rejection?.message ?? "", /\n/);
    }
    const several = rejectFrame(frame({ jsonrpc: "2.0", id: 9, method: "initialize", params: { capabilities: 1 } }));
    assert.match(several?.message ?? "", /\(and 2 more\)$/);
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: 10, method: "resources/read", params: { uri: "rag://collections" } })), null);
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: 11, method: "no/such/method", params: { x: 1 } })), null, "the SDK answers -32601");
    // A spec method this server does not serve is not found, whatever its params.
    assert.equal(rejectFrame(frame({ jsonrpc: "2.0", id: 12, method: "prompts/list", params: { cursor: 5 } })), null, "the SDK answers -32601");
  });

  it("names what else is wrong with a request that has jsonrpc, method and id", () => {
    const rejection = rejectFrame(frame({ jsonrpc: "2.0", id: 6, method: "tools/list", extra: 1 }));
    assert.equal(rejection?.code, -32600);
    assert.doesNotMatch(rejection?.message ?? "", /needs jsonrpc/);
    assert.match(rejection?.message ?? "", /extra/);
  });
});
