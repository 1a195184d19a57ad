/**
 * A gate in front of the SDK's stdio transport. The SDK drops a frame it cannot parse or validate with only
 * a log line, so the client waits forever (`tools/call` with `"params": null`, a line that is not JSON);
 * and a request whose params fail its method's schema (`resources/read` without `uri`) reaches the client
 * as -32603 with a multi-line zod dump. Each such frame is answered here at once with its JSON-RPC error
 * (-32602 and one line for bad params); every other line goes on to the SDK unchanged.
 */
import { PassThrough, type Readable, type Writable } from "node:stream";
import { createInterface } from "node:readline";

import { ClientRequestSchema, ErrorCode, JSONRPCMessageSchema, JSONRPCRequestSchema } from "@modelcontextprotocol/sdk/types.js";

import { isObject } from "./json.js";

type RequestId = string | number | null;

export interface Rejection {
  id: RequestId;
  code: number;
  message: string;
  /** For a JSON-RPC batch: the ids of its requests, each answered with this error (MCP has no batching). */
  batch?: Array<string | number>;
}

const BATCH_MESSAGE = "Invalid Request: JSON-RPC batches are not supported (MCP 2025-06-18 removed them); send one message per line";

/** The methods this server answers (server.ts, and the SDK's initialize and ping); others stay -32601. */
const SERVED = new Set(["initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read"]);

/** The SDK's schema of each request this server answers, by method: what its request handler parses. */
const REQUEST_SCHEMAS = new Map(
  ClientRequestSchema.options.filter((schema) => SERVED.has(schema.shape.method.value)).map((schema) => [schema.shape.method.value as string, schema]),
);

const describe = (value: unknown): string =>
  value === null ? "null" : Array.isArray(value) ? "an array" : `${/^[aeiou]/.test(typeof value) ? "an" : "a"} ${typeof value}`;

const requestId = (message: Record<string, unknown>): RequestId =>
  typeof message.id === "string" || (typeof message.id === "number" && Number.isFinite(message.id)) ? message.id : null;

/** Why a frame cannot go to the SDK, or null if it can. */
export function rejectFrame(line: string): Rejection | null {
  let message: unknown;
  try {
    message = JSON.parse(line);
  } catch (error) {
    return { id: null, code: ErrorCode.ParseError, message: `Parse error: the line is not JSON (${(error as Error).message})` };
  }
  return rejectMessage(message);
}

/** Why a parsed message cannot go to the SDK, or null if it can (stdio frames, HTTP bodies). */
export function rejectMessage(message: unknown): Rejection | null {
  if (Array.isArray(message)) {
    const ids = message.filter(isObject).map(requestId).filter((id) => id !== null);
    if (ids.length > 0) return { id: null, code: ErrorCode.InvalidRequest, message: BATCH_MESSAGE, batch: ids };
  }
  if (!isObject(message)) return { id: null, code: ErrorCode.InvalidRequest, message: `Invalid Request: a message must be a JSON object, not ${describe(message)}` };
  const id = requestId(message);
  const isRequest = typeof message.method === "string" && id !== null;
  if (isRequest && "params" in message && !isObject(message.params)) {
    return { id, code: ErrorCode.InvalidParams, message: `Invalid params: ${message.method as string} params must be an object, not ${describe(message.params)}` };
  }
  if (isRequest && message.method === "tools/call") {
    const params = isObject(message.params) ? message.params : {};
    if (typeof params.name !== "string") {
      return { id, code: ErrorCode.InvalidParams, message: `Invalid params: tools/call needs params.name, the tool's name (a string), not ${describe(params.name)}` };
    }
    if ("arguments" in params && params.arguments !== undefined && !isObject(params.arguments)) {
      return {
        id,
        code: ErrorCode.InvalidParams,
        message: `Invalid params: tools/call arguments must be a JSON object of the tool's arguments, not ${describe(params.arguments)}`,
      };
    }
  }
  if (isRequest && isObject(message.params)) {
    const meta = message.params._meta;
    if (meta !== undefined && !isObject(meta)) {
      return { id, code: ErrorCode.InvalidParams, message: `Invalid params: params._meta must be an object, not ${describe(meta)}` };
    }
    const token = isObject(meta) ? meta.progressToken : undefined;
    if (token !== undefined && typeof token !== "string" && !Number.isInteger(token)) {
      return {
        id,
        code: ErrorCode.InvalidParams,
        message: `Invalid params: params._meta.progressToken must be a string or an integer, not ${typeof token === "number" ? String(token) : describe(token)}`,
      };
    }
  }
  if (!JSONRPCMessageSchema.safeParse(message).success) {
    if (!isRequest) {
      // A request whose id is unusable gets its error with id null; a notification or response gets none.
      const badId = "id" in message && typeof message.method === "string";
      return badId ? { id: null, code: ErrorCode.InvalidRequest, message: "Invalid Request: id must be a string or a number" } : null;
    }
    if (message.jsonrpc !== "2.0") {
      return { id, code: ErrorCode.InvalidRequest, message: "Invalid Request: not a JSON-RPC 2.0 request (needs jsonrpc \"2.0\", method, id)" };
    }
    // jsonrpc, method and id are fine, so name what is not (an unknown top-level key, a bad _meta field).
    const issue = JSONRPCRequestSchema.safeParse(message).error?.issues[0];
    const where = issue?.path.length ? `${issue.path.map(String).join(".")}: ` : "";
    return { id, code: ErrorCode.InvalidRequest, message: `Invalid Request: ${where}${issue?.message ?? "not a valid request"}` };
  }
  // The SDK parses params with the method's schema inside its handler, where a failure becomes -32603.
  const schema = isRequest ? REQUEST_SCHEMAS.get(message.method as string) : undefined;
  const issues = schema?.safeParse(message).error?.issues;
  if (issues?.length) {
    const [first] = issues;
    const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
    return { id, code: ErrorCode.InvalidParams, message: `Invalid params: ${message.method as string} ${first!.path.map(String).join(".")}: ${first!.message}${more}` };
  }
  return null;
}

/**
 * The stream the SDK's StdioServerTransport reads: `input`'s lines, less the frames answered here with
 * their error on `output` (each a whole line, so they never interleave with the SDK's own writes).
 */
export function gatedInput(input: Readable, output: Writable): Readable {
  const gated = new PassThrough();
  const lines = createInterface({ input, crlfDelay: Infinity });
  lines.on("line", (line) => {
    if (!line.trim()) return;
    const rejection = rejectFrame(line);
    if (!rejection) {
      gated.write(`${line}\n`);
      return;
    }
    console.error(`[iris-rag] answered a bad frame with ${rejection.code}: ${rejection.message}`);
    const { id, code, message, batch } = rejection;
    // A batch is answered as JSON-RPC 2.0 answers one: an array holding each request's error.
    const answer = batch ? batch.map((each) => ({ jsonrpc: "2.0", id: each, error: { code, message } })) : { jsonrpc: "2.0", id, error: { code, message } };
    output.write(`${JSON.stringify(answer)}\n`);
  });
  lines.on("close", () => gated.end());
  return gated;
}
