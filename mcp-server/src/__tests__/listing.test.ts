import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Ajv } from "ajv";

import type { WorkerBridge } from "../bridge.js";
import { listedInputSchema, listedOutputSchema, prune, summarize } from "../listing.js";
import { renderTechniqueResult, snippet } from "../render.js";
import { ToolRouter } from "../tools.js";
import { CORRELATION_FIELDS } from "../schemas.js";
import { realToolSpecs } from "./helpers.js";

/** What a client's model reads on every turn: the whole tools/list result (issue 15: under 24,000 characters). */
const TOOLS_LIST_BUDGET = 24_000;

const router = () => new ToolRouter({} as WorkerBridge, realToolSpecs());

describe("tools/list", () => {
  it(`stays under ${TOOLS_LIST_BUDGET} characters with every tool served`, () => {
    const tools = router().listTools();
    assert.equal(tools.length, realToolSpecs().length);
    const size = JSON.stringify({ tools }).length;
    assert.ok(size < TOOLS_LIST_BUDGET, `tools/list is ${size} characters`);
  });

  it("keeps every argument and every required field a call needs", () => {
    for (const spec of realToolSpecs()) {
      const listed = listedInputSchema(spec.inputSchema) as Record<string, any>;
      const full = spec.inputSchema as Record<string, any>;
      // request_id and session_id, on every tool, are explained once in the server's instructions.
      const needed = Object.keys(full.properties ?? {}).filter((name) => !(CORRELATION_FIELDS as readonly string[]).includes(name));
      assert.deepEqual(Object.keys(listed.properties ?? {}), needed, spec.name);
      assert.ok(CORRELATION_FIELDS.every((name) => name in full.properties), `${spec.name} lacks request_id/session_id`);
      assert.deepEqual(listed.required, full.required, spec.name);
      for (const [name, property] of Object.entries<Record<string, any>>(full.properties ?? {})) {
        if (!property.properties) continue;
        if (name === "options") {
          // Listed as one line naming every option, its type, range and default.
          for (const option of Object.keys(property.properties)) assert.match(listed.properties.options.description, new RegExp(`\\b${option} \\(`));
        } else {
          assert.deepEqual(Object.keys(listed.properties[name].properties), Object.keys(property.properties));
        }
      }
    }
  });

  it("lists schemas that accept everything the full schemas accept", () => {
    // Weaker, never stricter: a value the server takes (or returns) passes the listed schema too.
    const ajv = new Ajv({ strict: false });
    const answer = {
      success: true,
      technique: "basic",
      query: "q",
      answer: null,
      retrieved_documents: [{ id: "d", chunk_id: "d#0", content: "x", metadata: {}, similarity_score: 0.5, source: "s" }],
      performance: { total_time_ms: 1, retrieval_time_ms: 1, generation_time_ms: 0, documents_searched: 1 },
      metadata: { timestamp: "t", collection_id: "c", model_info: { embedding_model: "m", llm_model: "l" }, technique_specific: {} },
    };
    const args = { query: "q", collection_id: "c", options: { top_k: 3, filters: { year: { gte: 2020 } } }, technique_params: {} };
    const basic = realToolSpecs().find((spec) => spec.name === "rag_basic")!;
    assert.ok(ajv.validate(listedInputSchema(basic.inputSchema), args));
    for (const spec of realToolSpecs()) {
      const listed = listedInputSchema(spec.inputSchema) as Record<string, any>;
      assert.notEqual(listed.additionalProperties, false, `${spec.name}: request_id/session_id would be refused`);
    }
    assert.ok(ajv.validate(listedOutputSchema(basic.outputSchema!), answer));
    assert.ok(ajv.validate(listedOutputSchema(basic.outputSchema!), { ...answer, extra: 1 }));
  });

  it("summarizes the options block as one line", () => {
    const options = { type: "object", description: "Lead.", properties: { top_k: { type: "integer", minimum: 1, maximum: 50, default: 5 }, generate: { type: "boolean", default: true, description: "false: passages only." } } };
    assert.deepEqual(summarize(options), { type: "object", description: "Lead. top_k (integer 1-50, default 5); generate (boolean, default true): false: passages only" });
  });

  it("cuts nesting at the given depth, keeping a property's own keywords there", () => {
    const schema = {
      type: "object",
      properties: { a: { type: "object", description: "A.", properties: { b: { type: "object", properties: { c: { type: "string" } } } } } },
    };
    assert.deepEqual(prune(schema, 2, true), {
      type: "object",
      properties: { a: { type: "object", description: "A.", properties: { b: { type: "object" } } } },
    });
    assert.deepEqual(prune(schema, 1, false), { type: "object", properties: { a: { type: "object" } } });
  });

  it("shows destructive tools as destructive and read-only tools as read-only", () => {
    const tools = new Map(router().listTools().map((tool) => [tool.name, tool]));
    for (const name of ["rag_ingest", "rag_delete_documents", "rag_delete_collection"]) {
      assert.equal(tools.get(name)?.annotations?.destructiveHint, true, name);
    }
    assert.deepEqual(tools.get("rag_basic")?.annotations, { readOnlyHint: true, openWorldHint: false });
  });
});

describe("a technique result's text", () => {
  it("numbers sources by document as the answer cites them, with ids, titles, scores and snippets", () => {
    const chunk = (id: string, n: number, score: number) => ({ id, chunk_id: `${id}#${n}`, title: `T ${id}`, content: `text of ${id} `.repeat(50), similarity_score: score });
    const text = renderTechniqueResult({
      technique: "hybrid_ifind",
      answer: "A [1] B [2]",
      retrieved_documents: [chunk("d1", 0, 0.9), chunk("d2", 3, 0.8), chunk("d1", 1, 0.7)],
      performance: { total_time_ms: 12.4 },
      metadata: { collection_id: "c" },
    });
    assert.match(text, /^A \[1\] B \[2\]\n\nPassages \(hybrid_ifind, collection c, 12 ms\):\n/);
    assert.match(text, /\[1\] T d1 \| document d1 \| chunks d1#0, d1#1 \| score 0\.900\n {4}text of d1/);
    assert.match(text, /\[2\] T d2 \| document d2 \| chunks d2#3 \| score 0\.800/);
    assert.ok(!text.includes("[3]"));
  });

  it("ends with the note of an index still being built, and only then", () => {
    const base = { technique: "noderag", answer: "A", retrieved_documents: [], performance: {} };
    const note = "the noderag index is still being built: this search covered 3 of 9 documents";
    const partial = renderTechniqueResult({ ...base, metadata: { technique_specific: { index_build: { state: "building", note } } } });
    assert.ok(partial.endsWith(`\n\nNote: ${note}`));
    assert.ok(!renderTechniqueResult({ ...base, metadata: { technique_specific: {} } }).includes("Note:"));
  });

  it("says when no answer was generated and when nothing was retrieved", () => {
    const text = renderTechniqueResult({ technique: "basic", answer: null, retrieved_documents: [], metadata: {}, performance: {} });
    assert.match(text, /no answer generated/);
    assert.match(text, /no passages retrieved/);
  });

  it("says passages were left out, not that none were retrieved, under include_sources false", () => {
    const text = renderTechniqueResult({
      technique: "basic",
      answer: "A [1] B [2]",
      retrieved_documents: [],
      metadata: { sources_omitted: 2 },
      performance: {},
    });
    assert.match(text, /\(2 passages retrieved, left out: options\.include_sources is false\)/);
    assert.ok(!text.includes("no passages retrieved"));
  });

  it("shows options.cot_steps after the answer, labelled by source, each step with its chunk ids", () => {
    const base = { technique: "basic", answer: "A [1]", retrieved_documents: [], metadata: {}, performance: {} };
    const extractive = renderTechniqueResult({
      ...base,
      cot_steps: { source: "extractive", note: "n", steps: [{ step: 1, text: "Scored.", chunk_ids: ["d1#0", "d2#0"] }, { step: 2, text: "Quoted.", chunk_ids: [] }] },
    });
    assert.match(extractive, /^A \[1\]\n\nSteps \(extractive evidence chain, not model reasoning\):\n1\. Scored\. \{d1#0, d2#0\}\n2\. Quoted\.\n\nPassages/);
    const none = renderTechniqueResult({ ...base, cot_steps: { source: "llm", note: "no Steps: section", steps: [] } });
    assert.match(none, /Steps \(the LLM's own\):\n\(none: no Steps: section\)/);
    assert.ok(!renderTechniqueResult(base).includes("Steps"));
  });

  it("cuts snippets at a word boundary", () => {
    assert.equal(snippet("one two three", 100), "one two three");
    assert.equal(snippet("alpha beta gamma delta", 17), "alpha beta gamma …");
  });
});
