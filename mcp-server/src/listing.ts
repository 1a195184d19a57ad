/**
 * What tools/list shows a client: the tool schemas with the validation detail an LLM does not need left out.
 * Every tool list is read by the model on each turn, so it is kept small (under 24,000 characters for all
 * the tools; a test holds it there). Calls are still validated against the full schemas (validation.ts), and
 * the listed schemas only ever accept more than the full ones, so a client that checks arguments or
 * structuredContent against them never rejects what the server accepts or returns.
 */
import { isObject, type JsonObject } from "./json.js";
import { CORRELATION_FIELDS } from "./schemas.js";

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

/**
 * Top-level arguments listed as one line of text instead of a nested schema: `options`, the same block of
 * settings on every technique tool (a structured copy per tool cost 600 characters each).
 */
const SUMMARIZED = new Set(["options"]);

/** One value's type, range and default, as `integer 1-50, default 5`. */
function brief(schema: JsonObject): string {
  const type = Array.isArray(schema.type) ? schema.type.join("|") : String(schema.type ?? "any");
  const range = schema.minimum !== undefined || schema.maximum !== undefined ? ` ${String(schema.minimum ?? "")}-${String(schema.maximum ?? "")}` : "";
  const fallback = schema.default !== undefined ? `, default ${JSON.stringify(schema.default)}` : "";
  return `${type}${range}${fallback}`;
}

/** An object schema as `{"type": "object", "description": "a (integer 1-50, default 5); b (boolean): ..."}`. */
export function summarize(schema: JsonObject): JsonObject {
  const properties = isObject(schema.properties) ? schema.properties : {};
  const fields = Object.entries(properties)
    .filter((entry): entry is [string, JsonObject] => isObject(entry[1]))
    .map(([name, field]) => `${name} (${brief(field)})${typeof field.description === "string" ? `: ${field.description.replace(/\.$/, "")}` : ""}`);
  const lead = typeof schema.description === "string" ? `${schema.description} ` : "";
  return { type: "object", description: `${lead}${fields.join("; ")}` };
}

/** Input schemas: properties nested deeper than this (a filter's conditions, a document's fields' own parts) keep only their own keywords. */
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
      Object.entries(schema.properties).map(([name, child]) => [
        name,
        depth === 0 && describe && SUMMARIZED.has(name) && isObject(child) ? summarize(child) : prune(child, maxDepth, describe, depth + 1),
      ]),
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

/**
 * The input schema as listed. request_id and session_id (on every tool) are explained once, in the server's
 * instructions, instead of 22 times here; so that the listing still accepts them, its top level is left open
 * (no `additionalProperties: false`: an unknown argument is still refused when the call is validated).
 */
export function listedInputSchema<T>(schema: T): T {
  const listed = prune(schema, INPUT_DEPTH, true);
  if (!isObject(listed)) return listed as T;
  const { additionalProperties, properties, ...rest } = listed;
  const kept = isObject(properties) ? Object.fromEntries(Object.entries(properties).filter(([name]) => !(CORRELATION_FIELDS as readonly string[]).includes(name))) : properties;
  return { ...rest, ...(kept !== undefined && { properties: kept }), ...(additionalProperties !== false && additionalProperties !== undefined && { additionalProperties }) } as T;
}

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

/**
 * Annotations as MCP reads them: idempotentHint false and openWorldHint true (their defaults) are left out,
 * and so are destructiveHint and idempotentHint on a read-only tool, where MCP says they mean nothing.
 * readOnlyHint, and a write tool's destructiveHint, are always shown, so neither is ever implicit.
 */
export function listedAnnotations<T extends ToolAnnotations>(annotations: T): Partial<T> {
  const { readOnlyHint, destructiveHint, idempotentHint, openWorldHint, ...rest } = annotations;
  return {
    ...rest,
    ...(readOnlyHint !== undefined && { readOnlyHint }),
    ...(readOnlyHint !== true && destructiveHint !== undefined && { destructiveHint }),
    ...(readOnlyHint !== true && idempotentHint === true && { idempotentHint }),
    ...(openWorldHint === false && { openWorldHint }),
  } as Partial<T>;
}

interface ToolAnnotations {
  readOnlyHint?: boolean;
  destructiveHint?: boolean;
  idempotentHint?: boolean;
  openWorldHint?: boolean;
}
