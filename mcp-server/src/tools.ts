import { ErrorCode, McpError, type CallToolResult, type Tool } from "@modelcontextprotocol/sdk/types.js";

import { hasScope, RateLimiter, rateLimitMessage, requiredScope, type Principal } from "./auth.js";
import type { Progress, WorkerBridge } from "./bridge.js";
import { asBridgeError, BridgeError } from "./errors.js";
import { isObject, type JsonObject } from "./json.js";
import { listedAnnotations, listedInputSchema, listedOutputSchema } from "./listing.js";
import { renderTechniqueResult } from "./render.js";
import { CORRELATION_FIELDS } from "./schemas.js";
import { compileArgumentValidator, type ArgumentValidator } from "./validation.js";

/** One tool as iris_rag/schemas/ defines it (and the worker's `describe` returns it). */
export interface ToolSpec {
  name: string;
  title?: string;
  description?: string;
  annotations?: Tool["annotations"];
  /** Where the call goes: `method`, or `execute` of `technique`; `served_by`: the technique it needs. */
  bridge: { method: string; technique?: string; served_by?: string };
  inputSchema: Tool["inputSchema"];
  outputSchema?: Tool["outputSchema"];
}

interface CatalogEntry {
  spec: ToolSpec;
  validate: ArgumentValidator;
}

const LONE_SURROGATES = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** Answers even when the worker cannot, so a client can always ask whether the server is up. */
export const HEALTH_TOOL = "rag_health_check";
/** The one name rag_metrics records calls to unknown tools under (parenthesized: no tool is named so). */
export const UNKNOWN_TOOL = "(unknown tool)";

/**
 * Whether the worker recorded a failed call itself (it records every call it ran, and a timed-out or
 * cancelled one under TIMEOUT_EXCEEDED or REQUEST_CANCELLED); the front end records the rest exactly once.
 */
function recordedByWorker(error: BridgeError): boolean {
  switch (error.code) {
    case "RATE_LIMIT_EXCEEDED":
    case "WORKER_CRASHED":
    case "WORKER_UNAVAILABLE":
      return false;
    case "TIMEOUT_EXCEEDED":
    case "REQUEST_CANCELLED":
      // A call that timed out or was cancelled while queued here never reached the worker.
      return error.details?.stage !== "queued";
    default:
      return true;
  }
}

/** The caller's request_id and session_id (valid ones only), echoed in every answer and stored with the call. */
export function correlationOf(args: unknown): Record<string, string> {
  if (!isObject(args)) return {};
  return Object.fromEntries(CORRELATION_FIELDS.flatMap((name) => {
    const value = args[name];
    // Counted in code points, as JSON Schema's maxLength (and Python's len) count them.
    return typeof value === "string" && value.length > 0 && [...value].length <= 128 ? [[name, value]] : [];
  }));
}

/** The error with the caller's ids in its details and partial result, as the worker echoes them. */
function withCorrelation(error: BridgeError, correlation: Record<string, string>): BridgeError {
  if (Object.keys(correlation).length === 0) return error;
  const details: Record<string, unknown> = { ...error.details, ...correlation };
  if (isObject(details.partial_result)) details.partial_result = { ...details.partial_result, ...correlation };
  return new BridgeError(error.code, error.message, details);
}

const textResult = (payload: unknown, extra: Partial<CallToolResult> = {}): CallToolResult => ({
  content: [{ type: "text", text: JSON.stringify(payload) }],
  ...extra,
});

/**
 * A tool's result: structuredContent is the whole object; the text content is the same JSON, except for the
 * technique tools, whose text is the answer and its sources (render.ts).
 */
export function successResult(result: unknown, asAnswer = false): CallToolResult {
  // Every tool declares an outputSchema, so clients require structuredContent to be an object.
  if (!isObject(result)) {
    return errorResult(new BridgeError("INTERNAL_ERROR", `The worker returned a ${typeof result} result instead of an object`));
  }
  if (!asAnswer) return textResult(result, { structuredContent: result });
  return { content: [{ type: "text", text: renderTechniqueResult(result) }], structuredContent: result };
}

export function errorResult(error: BridgeError): CallToolResult {
  const partial = error.details?.partial_result;
  return textResult(
    { success: false, error: error.toJSON(), hint: error.hint },
    // A partial result (e.g. the retrieved documents after GENERATION_FAILED) still matches outputSchema.
    { isError: true, ...(isObject(partial) && { structuredContent: partial }) },
  );
}

/** The health check's answer when the worker cannot be reached (shape of rag_health_check's outputSchema). */
export function unhealthyResult(error: BridgeError, responseTimeMs: number): CallToolResult {
  const now = new Date().toISOString();
  return successResult({
    status: "unhealthy",
    timestamp: now,
    components: {
      python_bridge: {
        status: "unhealthy",
        last_check: now,
        response_time_ms: Math.round(responseTimeMs * 100) / 100,
        error_message: `${error.code}: ${error.message}`,
      },
    },
  });
}

/** Serves tools/list from the schema files and tools/call through the worker. */
export class ToolRouter {
  private readonly catalog: Map<string, CatalogEntry>;

  constructor(
    private readonly bridge: WorkerBridge,
    /** The served tools (schemas.ts servedToolSpecs): the same list the worker's describe returns. */
    specs: readonly ToolSpec[],
    /** Called after each successful call of a tool that writes (not readOnlyHint): resources changed. */
    private readonly onWrite?: (tool: string) => void,
    /** Per-principal token buckets (HTTP mode), shared by every session, resources and new sessions. */
    private readonly limiter: RateLimiter = new RateLimiter(),
  ) {
    this.catalog = new Map(specs.map((spec) => [spec.name, { spec, validate: compileArgumentValidator(spec.name, spec.inputSchema) }]));
  }

  /** Start the worker now, so the first call does not wait for Python to start. */
  warmUp(timeoutMs: number): Promise<unknown> {
    return this.bridge.request("describe", {}, { timeoutMs });
  }

  listTools(): Tool[] {
    return [...this.catalog.values()].map(({ spec: { name, title, description, inputSchema, outputSchema, annotations } }) => ({
      name,
      ...(title !== undefined && { title }),
      ...(description !== undefined && { description }),
      inputSchema: listedInputSchema(inputSchema),
      ...(outputSchema !== undefined && { outputSchema: listedOutputSchema(outputSchema) }),
      ...(annotations !== undefined && { annotations: listedAnnotations(annotations) }),
    }));
  }

  /**
   * One tools/call; `signal` (the client's notifications/cancelled) cancels it in the worker too.
   * `principal` is the HTTP caller (absent on stdio: the local user may call everything). `onProgress`
   * gets the worker's steps (the client asked for them with a progressToken). An unknown tool throws
   * McpError -32602 (a protocol error), even over the key's rate, after it is recorded (as UNKNOWN_TOOL)
   * and has spent its token.
   */
  async callTool(
    name: string,
    args: unknown = {},
    signal?: AbortSignal,
    principal?: Principal,
    onProgress?: (progress: Progress) => void,
  ): Promise<CallToolResult> {
    const started = performance.now();
    const entry = this.catalog.get(name);
    const correlation = correlationOf(args);
    // A name that is no tool is recorded under one group: the client's names would each add a by_tool entry.
    const recorded = entry ? name : UNKNOWN_TOOL;
    const { technique } = entry?.spec.bridge ?? {};
    const fail = (error: BridgeError): CallToolResult => {
      this.recordFrontEndFailure(recorded, technique, started, error.code, principal, correlation);
      return errorResult(withCorrelation(error, correlation));
    };
    let limited: BridgeError | undefined;
    if (principal) {
      // Every tools/call spends a token (README), first: names that are no tools, or tools the key may not
      // use, are no way past the key's rate.
      const waitMs = this.limiter.take(principal);
      if (waitMs > 0) {
        limited = new BridgeError("RATE_LIMIT_EXCEEDED", rateLimitMessage(principal, waitMs), { retry_after_ms: waitMs });
      }
    }
    if (!entry) {
      // The name is the client's: keep it short and valid Unicode before it is echoed.
      const shown = name.slice(0, 128).replace(LONE_SURROGATES, "\uFFFD");
      // Over the rate, it is recorded so (rag_metrics counts every call the rate refused); the answer is the
      // protocol error an unknown tool always is, whatever the bucket holds.
      const code = limited?.code ?? "PIPELINE_NOT_FOUND";
      this.recordFrontEndFailure(recorded, undefined, started, code, principal, correlation);
      const known = [...this.catalog.keys()].join(", ");
      // MCP 2025-06-18 (tools, Error Handling): an unknown tool is a protocol error, not a tool result.
      throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${shown}; available tools: ${known}`);
    }
    if (limited) return fail(limited);
    if (principal) {
      const scope = requiredScope(entry.spec.annotations);
      if (!hasScope(principal, scope)) {
        return fail(new BridgeError("FORBIDDEN", `${name} needs the '${scope}' scope; this key has: ${principal.scopes.join(", ") || "none"}`));
      }
    }
    const failure = entry.validate(args);
    if (failure) return fail(new BridgeError(failure.code, failure.message, { errors: failure.errors }));

    try {
      const params = technique ? { technique, arguments: args } : (args as JsonObject);
      const method = technique ? "execute" : entry.spec.bridge.method;
      const result = await this.bridge.request(method, params, { signal, onProgress, ...(principal && { principal }) });
      if (entry.spec.annotations?.readOnlyHint !== true) this.onWrite?.(name);
      return successResult(result, technique !== undefined);
    } catch (error) {
      const bridgeError = asBridgeError(error);
      if (!recordedByWorker(bridgeError)) this.recordFrontEndFailure(name, technique, started, bridgeError.code, principal, correlation);
      return name === HEALTH_TOOL ? unhealthyResult(bridgeError, performance.now() - started) : errorResult(withCorrelation(bridgeError, correlation));
    }
  }

  /**
   * GET /health's check: rag_health_check's answer (no details), asked of the worker's probe_health, which
   * records no call: a probe is no client's call, and one a second would swamp rag_metrics' figures.
   */
  async probeHealth(): Promise<CallToolResult> {
    const started = performance.now();
    try {
      return successResult(await this.bridge.request("probe_health", { include_details: false }));
    } catch (error) {
      return unhealthyResult(asBridgeError(error), performance.now() - started);
    }
  }

  /** Calls that failed here never completed at the worker, but they still belong in rag_metrics. */
  private recordFrontEndFailure(tool: string, technique: string | undefined, started: number, code: string, principal?: Principal, correlation: Record<string, string> = {}): void {
    this.bridge
      .request(
        "record_call",
        {
          tool,
          technique: technique ?? null,
          duration_ms: performance.now() - started,
          success: false,
          error_code: code,
          ...correlation,
        },
        principal && { principal },
      )
      .catch((error: unknown) => console.error(`[iris-rag] record_call failed: ${asBridgeError(error).message}`));
  }
}
