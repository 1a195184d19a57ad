/**
 * The tool table read from iris_rag/schemas/ (the one source of truth), built exactly as
 * iris_rag.schemas.served_tool_specs builds it for the worker's `describe`: the front end lists the tools
 * without the worker, so a worker that cannot start still leaves the client its tools and rag_health_check.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { isObject, type JsonObject } from "./json.js";
import type { ToolSpec } from "./tools.js";

const COMMON_PREFIX = "common.json#/$defs/";
/** Optional on every tool, echoed in its result (common.json's definitions; added here to each tool). */
export const CORRELATION_FIELDS = ["request_id", "session_id"] as const;

/** Replace every reference to common.json with the definition itself, recursively. */
function inline(node: unknown, defs: JsonObject): unknown {
  if (Array.isArray(node)) return node.map((item) => inline(item, defs));
  if (!isObject(node)) return node;
  const ref = node.$ref;
  if (typeof ref === "string" && ref.startsWith(COMMON_PREFIX)) {
    const name = ref.slice(COMMON_PREFIX.length);
    if (!Object.hasOwn(defs, name)) throw new Error(`common.json has no $defs/${name}`);
    return inline(structuredClone(defs[name]), defs);
  }
  return Object.fromEntries(Object.entries(node).map(([key, value]) => [key, inline(value, defs)]));
}

/** Every technique tool takes the same envelope; only technique_params differs. */
const techniqueInputSchema = (techniqueParams: unknown): JsonObject => ({
  type: "object",
  additionalProperties: false,
  required: ["query"],
  properties: {
    query: { $ref: `${COMMON_PREFIX}query` },
    collection_id: { $ref: `${COMMON_PREFIX}collection_id` },
    options: { $ref: `${COMMON_PREFIX}options` },
    technique_params: techniqueParams,
  },
});

/** Every tool spec the schema files define, in file-name order. */
export function loadToolSpecs(schemaDir: string): ToolSpec[] {
  const defs = (JSON.parse(readFileSync(join(schemaDir, "common.json"), "utf8")) as { $defs: JsonObject }).$defs;
  const files = readdirSync(join(schemaDir, "tools"))
    .filter((name) => name.endsWith(".json"))
    .sort();
  return files.map((file) => {
    const spec = JSON.parse(readFileSync(join(schemaDir, "tools", file), "utf8")) as JsonObject;
    if ("technique_params" in spec) {
      const { technique_params: techniqueParams, ...rest } = spec;
      Object.assign(rest, { inputSchema: techniqueInputSchema(techniqueParams), outputSchema: { $ref: `${COMMON_PREFIX}technique_response` } });
      return inline(withCorrelation(rest, defs), defs) as ToolSpec;
    }
    return inline(withCorrelation(spec, defs), defs) as ToolSpec;
  });
}

/** request_id and session_id in the tool's input and output: one definition, referenced by every tool. */
function withCorrelation(spec: JsonObject, defs: JsonObject): JsonObject {
  for (const key of ["inputSchema", "outputSchema"]) {
    const declared = spec[key];
    if (!isObject(declared)) continue;
    // The technique tools' shared response: inlined first, then extended.
    const schema = typeof declared.$ref === "string" ? (inline(declared, defs) as JsonObject) : declared;
    spec[key] = schema;
    const properties = isObject(schema.properties) ? schema.properties : (schema.properties = {});
    for (const name of CORRELATION_FIELDS) properties[name] = { $ref: `${COMMON_PREFIX}${name}` };
  }
  return spec;
}

/** The server's `instructions` for the client's model: which tool to start with and when to switch. */
export const loadInstructions = (schemaDir: string): string => readFileSync(join(schemaDir, "instructions.md"), "utf8").trim();

/** The technique a tool needs (bridge.technique or bridge.served_by); undefined for tools always served. */
export const techniqueOf = (spec: ToolSpec): string | undefined => spec.bridge.technique ?? spec.bridge.served_by;

/**
 * The tools served with these techniques (null: all of them): a tool is listed iff it is served, so a tool
 * whose technique is off (RAG_TECHNIQUES) is neither listed nor callable.
 */
export function servedToolSpecs(specs: readonly ToolSpec[], techniques: readonly string[] | null): ToolSpec[] {
  return specs.filter((spec) => {
    const technique = techniqueOf(spec);
    return technique === undefined || techniques === null || techniques.includes(technique);
  });
}

/** RAG_TECHNIQUES as the worker's Settings.served_techniques reads it: null means all. */
export function parseTechniques(raw: string | undefined): string[] | null {
  const names = (raw ?? "")
    .split(",")
    .map((name) => name.trim())
    .filter(Boolean);
  return names.length === 0 || names.includes("all") ? null : names;
}
