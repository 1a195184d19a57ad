import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";

import type { ErrorCode } from "./errors.js";

/** One shared instance: Ajv caches compiled code per instance, and the tool schemas are 2020-12. */
const ajv = new Ajv2020({ allErrors: true, strict: false });

export interface ValidationFailure {
  code: Extract<ErrorCode, "INVALID_QUERY" | "INVALID_PARAMETERS">;
  /** Every Ajv error, in Ajv's own words. */
  message: string;
  errors: Array<Pick<ErrorObject, "instancePath" | "keyword" | "message" | "params">>;
}

/** Checks one tool's arguments; returns null when they are valid. */
export type ArgumentValidator = (args: unknown) => ValidationFailure | null;

/** The worker raises INVALID_QUERY for a bad query; the front end must answer the same way. */
const isQueryError = (error: ErrorObject): boolean =>
  error.instancePath === "/query" || (error.keyword === "required" && error.params.missingProperty === "query");

export function codeFor(errors: readonly ErrorObject[]): ValidationFailure["code"] {
  return errors.some(isQueryError) ? "INVALID_QUERY" : "INVALID_PARAMETERS";
}

/** Compile a tool's inputSchema once; the returned function is called per tools/call. */
export function compileArgumentValidator(toolName: string, inputSchema: object): ArgumentValidator {
  const validate: ValidateFunction = ajv.compile(inputSchema);
  return (args) => {
    if (validate(args)) return null;
    const errors = validate.errors ?? [];
    return {
      code: codeFor(errors),
      message: `Invalid arguments for ${toolName}: ${ajv.errorsText(errors, { dataVar: "arguments" })}`,
      errors: errors.map(({ instancePath, keyword, message, params }) => ({ instancePath, keyword, message, params })),
    };
  };
}
