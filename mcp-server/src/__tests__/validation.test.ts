import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { compileArgumentValidator } from "../validation.js";
import { realToolSpecs, toolSpec } from "./helpers.js";

const validateBasic = compileArgumentValidator("rag_basic", toolSpec("rag_basic").inputSchema);

describe("argument validation against the real tool schemas", () => {
  it("compiles every tool's inputSchema", () => {
    const specs = realToolSpecs();
    assert.ok(specs.length >= 6);
    for (const spec of specs) assert.equal(typeof compileArgumentValidator(spec.name, spec.inputSchema), "function");
  });

  it("accepts a valid call", () => {
    assert.equal(validateBasic({ query: "What is RAG?", collection_id: "e2e", options: { top_k: 5, generate: false } }), null);
    assert.equal(validateBasic({ query: "x".repeat(2048) }), null);
  });

  for (const [label, query] of [
    ["empty", ""],
    ["whitespace-only", " \t\n "],
    ["2,049-character", "x".repeat(2049)],
    ["non-string", 42],
  ] as const) {
    it(`rejects a ${label} query with INVALID_QUERY`, () => {
      const failure = validateBasic({ query });
      assert.equal(failure?.code, "INVALID_QUERY");
      assert.match(failure.message, /arguments\/query/);
    });
  }

  it("rejects missing required arguments with MISSING_REQUIRED_FIELD, as the worker does", () => {
    assert.equal(validateBasic({ options: { top_k: 3 } })?.code, "MISSING_REQUIRED_FIELD");
    const ingest = compileArgumentValidator("rag_ingest", toolSpec("rag_ingest").inputSchema);
    assert.equal(ingest({ collection_id: "c", documents: [{ title: "no content" }] })?.code, "MISSING_REQUIRED_FIELD");
    // A missing field beside a wrong one: the wrong one decides.
    assert.equal(validateBasic({ options: { top_k: 0 } })?.code, "INVALID_PARAMETERS");
  });

  it("accepts request_id and session_id on every tool and refuses ones that are not short strings", () => {
    assert.equal(validateBasic({ query: "ok", request_id: "r-1", session_id: "s-1" }), null);
    assert.equal(validateBasic({ query: "ok", request_id: 7 })?.code, "INVALID_PARAMETERS");
    assert.equal(validateBasic({ query: "ok", session_id: "x".repeat(129) })?.code, "INVALID_PARAMETERS");
  });

  for (const topK of [0, 51, "5", 2.5]) {
    it(`rejects top_k ${JSON.stringify(topK)} with INVALID_PARAMETERS`, () => {
      const failure = validateBasic({ query: "ok", options: { top_k: topK } });
      assert.equal(failure?.code, "INVALID_PARAMETERS");
      assert.match(failure.message, /arguments\/options\/top_k/);
    });
  }

  it("rejects an unknown options key and an unknown top-level key with INVALID_PARAMETERS", () => {
    const options = validateBasic({ query: "ok", options: { topk: 5 } });
    assert.equal(options?.code, "INVALID_PARAMETERS");
    assert.match(options.message, /additional properties/);
    assert.equal(validateBasic({ query: "ok", colection_id: "x" })?.code, "INVALID_PARAMETERS");
  });

  it("reports every error (allErrors) and lets a query error decide the code", () => {
    const failure = validateBasic({ query: "", options: { top_k: 0, temperature: 3 } });
    assert.equal(failure?.code, "INVALID_QUERY");
    for (const path of ["arguments/query", "arguments/options/top_k", "arguments/options/temperature"]) {
      assert.ok(failure.message.includes(path), `${path} missing from: ${failure.message}`);
    }
    assert.ok(failure.errors.length >= 3);
  });

  it("validates the other tools' arguments too", () => {
    const ingest = compileArgumentValidator("rag_ingest", toolSpec("rag_ingest").inputSchema);
    assert.equal(ingest({ collection_id: "e2e", documents: [{ content: "text" }] }), null);
    assert.equal(ingest({ collection_id: "e2e", documents: [] })?.code, "INVALID_PARAMETERS");
    assert.equal(ingest({ collection_id: "bad id!", documents: [{ content: "text" }] })?.code, "INVALID_PARAMETERS");
    const metrics = compileArgumentValidator("rag_metrics", toolSpec("rag_metrics").inputSchema);
    assert.equal(metrics({ time_range: "2h" })?.code, "INVALID_PARAMETERS");
  });
});
