import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";
import type { SchemaValidateFunction } from "ajv/dist/types/index.js";

import type { ErrorCode } from "./errors.js";

/** How deeply objects and arrays nest in a value (a scalar is 0); stops counting past limit. Never recurses. */
export function jsonDepth(value: unknown, limit: number): number {
  let deepest = 0;
  const stack: Array<[unknown, number]> = [[value, 0]];
  while (stack.length > 0) {
    const [node, parentDepth] = stack.pop()!;
    if (typeof node !== "object" || node === null) continue;
    const depth = parentDepth + 1;
    deepest = Math.max(deepest, depth);
    if (deepest > limit) return deepest;
    for (const child of Array.isArray(node) ? node : Object.values(node)) stack.push([child, depth]);
  }
  return deepest;
}

/** One shared instance: Ajv caches compiled code per instance, and the tool schemas are 2020-12. */
const ajv = new Ajv2020({ allErrors: true, strict: false });
// `maxDepth` bounds free-form JSON (ingest metadata, table rows); iris_rag/validation.py implements it too.
const maxDepth: SchemaValidateFunction = (limit: number, data: unknown): boolean => {
  const ok = jsonDepth(data, limit) <= limit;
  maxDepth.errors = ok ? undefined : [{ keyword: "maxDepth", message: `must not be nested more than ${limit} levels deep`, params: { limit } }];
  return ok;
};
ajv.addKeyword({ keyword: "maxDepth", schemaType: "number", errors: true, validate: maxDepth });

/** Nesting any argument may have: past it a value cannot reach the worker (orjson reads 1,024 levels). */
export const MAX_ARGUMENT_DEPTH = 64;

export interface ValidationFailure {
  code: Extract<ErrorCode, "INVALID_QUERY" | "INVALID_PARAMETERS" | "MISSING_REQUIRED_FIELD">;
  /** Every Ajv error, in Ajv's own words. */
  message: string;
  errors: Array<Pick<ErrorObject, "instancePath" | "keyword" | "message" | "params">>;
}

/** Checks one tool's arguments; returns null when they are valid. */
export type ArgumentValidator = (args: unknown) => ValidationFailure | null;

/** The worker raises INVALID_QUERY for a bad query; the front end must answer the same way. */
const isQueryError = (error: Pick<ErrorObject, "instancePath" | "keyword" | "params">): boolean =>
  error.instancePath === "/query" || error.instancePath.startsWith("/query/");

/**
 * As iris_rag/validation.py decides: MISSING_REQUIRED_FIELD when the only errors are absent required
 * arguments (the query included), else INVALID_QUERY when one is about the query, else INVALID_PARAMETERS.
 */
export function codeFor(errors: ReadonlyArray<Pick<ErrorObject, "instancePath" | "keyword" | "params">>): ValidationFailure["code"] {
  if (errors.length > 0 && errors.every((error) => error.keyword === "required")) return "MISSING_REQUIRED_FIELD";
  return errors.some(isQueryError) ? "INVALID_QUERY" : "INVALID_PARAMETERS";
}

/** A high surrogate not followed by a low one, or a low one not preceded by a high one. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

const pointer = (path: ReadonlyArray<string | number>): string => path.map((part) => `/${String(part).replaceAll("~", "~0").replaceAll("/", "~1")}`).join("");

/**
 * What no schema can express and the worker cannot read: text with a lone UTF-16 surrogate (not
 * encodable as UTF-8) and nesting past MAX_ARGUMENT_DEPTH. Checked before Ajv, without recursion.
 */
export function checkJsonText(toolName: string, args: unknown): ValidationFailure | null {
  const failure = (path: ReadonlyArray<string | number>, keyword: string, message: string): ValidationFailure => {
    const error = { instancePath: pointer(path), keyword, message, params: {} };
    return { code: codeFor([error]), message: `Invalid arguments for ${toolName}: arguments${error.instancePath} ${message}`, errors: [error] };
  };
  const stack: Array<[unknown, Array<string | number>]> = [[args, []]];
  while (stack.length > 0) {
    const [node, path] = stack.pop()!;
    if (typeof node === "string") {
      if (LONE_SURROGATE.test(node)) return failure(path, "wellFormed", "contains a lone UTF-16 surrogate (not valid Unicode text)");
      continue;
    }
    if (typeof node !== "object" || node === null) continue;
    if (path.length >= MAX_ARGUMENT_DEPTH) return failure(path, "maxDepth", `is nested more than ${MAX_ARGUMENT_DEPTH} levels deep`);
    const entries: Array<[string | number, unknown]> = Array.isArray(node) ? node.map((value, index) => [index, value]) : Object.entries(node);
    for (const [key, value] of entries) {
      if (typeof key === "string" && LONE_SURROGATE.test(key)) return failure(path, "wellFormed", "has a key with a lone UTF-16 surrogate (not valid Unicode text)");
      stack.push([value, [...path, key]]);
    }
  }
  return null;
}

/** Compile a tool's inputSchema once; the returned function is called per tools/call. */
export function compileArgumentValidator(toolName: string, inputSchema: object): ArgumentValidator {
  const validate: ValidateFunction = ajv.compile(inputSchema);
  return (args) => {
    const unreadable = checkJsonText(toolName, args);
    if (unreadable) return unreadable;
    if (validate(args)) return null;
    const errors = validate.errors ?? [];
    return {
      code: codeFor(errors),
      message: `Invalid arguments for ${toolName}: ${ajv.errorsText(errors, { dataVar: "arguments" })}`,
      errors: errors.map(({ instancePath, keyword, message, params }) => ({ instancePath, keyword, message, params })),
    };
  };
}
