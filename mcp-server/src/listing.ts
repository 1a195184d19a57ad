/**
 * What tools/list shows a client: the tool schemas with the validation detail an LLM does not need left out.
 * Every tool list is read by the model on each turn, so it is kept small (under 24,000 characters for all
 * the tools; a test holds it there). Calls are still validated against the full schemas (validation.ts), and
 * the listed schemas only ever accept more than the full ones, so a client that checks arguments or
 * structuredContent against them never rejects what the server accepts or returns.
 */
import { isObject, type JsonObject } from "./json.js";

/** Keywords about a value itself (not about nested values), kept at the depth where nesting stops. */
const SCALAR_KEYWORDS = new Set([
  "type",
  "description",
  "enum",
  "const",
  "default",
  "minimum",
  "maximum",
  "minItems",
  "maxItems",
  "uniqueItems",
]);

/** Validation detail listed nowhere. */
const DROPPED = new Set(["$comment", "pattern", "propertyNames", "minLength", "maxLength"]);

/** Input schemas: properties nested deeper than this (options.filters's inner conditions) show their type only. */
const INPUT_DEPTH = 2;
/** Output schemas: only the top-level fields and their types; the rest is in the README's tool reference. */
const OUTPUT_DEPTH = 1;

const pick = (schema: JsonObject, keep: (key: string) => boolean): JsonObject =>
  Object.fromEntries(Object.entries(schema).filter(([key]) => keep(key)));

/**
 * The schema cut at `maxDepth` levels of `properties` (array `items` stay on their array's level): below it a
 * property keeps its scalar keywords. `describe` false (outputs) drops descriptions, and keeps only the type
 * where nesting stops.
 */
export function prune(schema: unknown, maxDepth: number, describe: boolean, depth = 0): unknown {
  if (!isObject(schema)) return schema;
  const keepKey = (key: string): boolean => describe || key !== "description";
  if (depth >= maxDepth) return pick(schema, (key) => (describe ? SCALAR_KEYWORDS.has(key) : key === "type"));
  // Patterns, and closed nested objects, are enforced on every call; the model needs neither to call well.
  const out = pick(schema, (key) => keepKey(key) && !DROPPED.has(key) && !(depth > 0 && key === "additionalProperties"));
  if (isObject(schema.properties)) {
    out.properties = Object.fromEntries(
      Object.entries(schema.properties).map(([name, child]) => [name, prune(child, maxDepth, describe, depth + 1)]),
    );
  }
  if (isObject(schema.items)) out.items = prune(schema.items, maxDepth, describe, depth);
  if (isObject(schema.additionalProperties)) {
    const values = prune(schema.additionalProperties, maxDepth, describe, depth + 1);
    if (isObject(values) && Object.keys(values).length > 0) out.additionalProperties = values;
    else delete out.additionalProperties;
  }
  for (const key of ["anyOf", "oneOf", "allOf"] as const) {
    const branches = schema[key];
    if (Array.isArray(branches)) out[key] = branches.map((branch) => prune(branch, maxDepth, describe, depth));
  }
  return out;
}

export const listedInputSchema = <T>(schema: T): T => prune(schema, INPUT_DEPTH, true) as T;

/**
 * The output fields always present (`required`), with their types: optional fields and everything nested
 * are left out, and so is `required` itself (a weaker schema, never a stricter one).
 */
export function listedOutputSchema<T>(schema: T): T {
  const { required, properties, ...rest } = prune(schema, OUTPUT_DEPTH, false) as JsonObject;
  if (!Array.isArray(required) || !isObject(properties)) return rest as T;
  const always = Object.entries(properties).filter(([name]) => required.includes(name));
  return { ...rest, properties: Object.fromEntries(always) } as T;
}

/** MCP says destructiveHint and idempotentHint mean nothing on a read-only tool: list only what means something. */
export function listedAnnotations<T extends { readOnlyHint?: boolean }>(annotations: T): Partial<T> {
  if (annotations.readOnlyHint !== true) return annotations;
  const { destructiveHint: _destructive, idempotentHint: _idempotent, ...rest } = annotations as T & {
    destructiveHint?: boolean;
    idempotentHint?: boolean;
  };
  return rest as Partial<T>;
}
