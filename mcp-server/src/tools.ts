import type { CallToolResult, Tool } from "@modelcontextprotocol/sdk/types.js";

import type { WorkerBridge } from "./bridge.js";
import { asBridgeError, BridgeError } from "./errors.js";
import { isObject, type JsonObject } from "./json.js";
import { compileArgumentValidator, type ArgumentValidator } from "./validation.js";

/** One tool as the worker's `describe` returns it; the schemas are the single source of truth. */
export interface ToolSpec {
  name: string;
  title?: string;
  description?: string;
  annotations?: Tool["annotations"];
  bridge: { method: string; technique?: string };
  inputSchema: Tool["inputSchema"];
  outputSchema?: Tool["outputSchema"];
}

interface CatalogEntry {
  spec: ToolSpec;
  validate: ArgumentValidator;
}

/**
 * Failures the worker never recorded: calls it never received, or died handling. (A timed-out call is left
 * out: the worker still finishes it and records it with its real duration.)
 */
const FRONT_END_CODES = new Set(["RATE_LIMIT_EXCEEDED", "WORKER_CRASHED", "WORKER_UNAVAILABLE"]);

/** Answers even when the worker cannot, so a client can always ask whether the server is up. */
export const HEALTH_TOOL = "rag_health_check";

function parseToolSpecs(describeResult: unknown): ToolSpec[] {
  const tools = isObject(describeResult) ? describeResult.tools : undefined;
  if (!Array.isArray(tools)) {
    throw new BridgeError("INTERNAL_ERROR", "The worker's describe result has no tools array");
  }
  return tools.map((tool: unknown, index) => {
    const valid =
      isObject(tool) &&
      typeof tool.name === "string" &&
      isObject(tool.inputSchema) &&
      isObject(tool.bridge) &&
      typeof tool.bridge.method === "string";
    if (!valid) throw new BridgeError("INTERNAL_ERROR", `describe: tool #${index} lacks name, inputSchema or bridge.method`);
    return tool as unknown as ToolSpec;
  });
}

const textResult = (payload: unknown, extra: Partial<CallToolResult> = {}): CallToolResult => ({
  content: [{ type: "text", text: JSON.stringify(payload) }],
  ...extra,
});

export function successResult(result: unknown): CallToolResult {
  // Every tool declares an outputSchema, so clients require structuredContent to be an object.
  if (!isObject(result)) {
    return errorResult(new BridgeError("INTERNAL_ERROR", `The worker returned a ${typeof result} result instead of an object`));
  }
  return textResult(result, { structuredContent: result });
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

/** Serves tools/list and tools/call from the worker's tool table. */
export class ToolRouter {
  private catalog?: Promise<Map<string, CatalogEntry>>;

  constructor(
    private readonly bridge: WorkerBridge,
    /** Limit for `describe`: the first request also waits for the Python process to start. */
    private readonly describeTimeoutMs: number,
  ) {}

  /** Fetch and compile the tool table once; a failed load is retried on the next call. */
  load(): Promise<Map<string, CatalogEntry>> {
    this.catalog ??= this.bridge
      .request("describe", {}, this.describeTimeoutMs)
      .then((result) => {
        const entries = parseToolSpecs(result).map((spec): [string, CatalogEntry] => [
          spec.name,
          { spec, validate: compileArgumentValidator(spec.name, spec.inputSchema) },
        ]);
        return new Map(entries);
      })
      .catch((error: unknown) => {
        this.catalog = undefined;
        throw asBridgeError(error);
      });
    return this.catalog;
  }

  async listTools(): Promise<Tool[]> {
    const catalog = await this.load();
    return [...catalog.values()].map(({ spec: { name, title, description, inputSchema, outputSchema, annotations } }) => ({
      name,
      ...(title !== undefined && { title }),
      ...(description !== undefined && { description }),
      inputSchema,
      ...(outputSchema !== undefined && { outputSchema }),
      ...(annotations !== undefined && { annotations }),
    }));
  }

  async callTool(name: string, args: JsonObject = {}): Promise<CallToolResult> {
    const started = performance.now();
    let catalog: Map<string, CatalogEntry>;
    try {
      catalog = await this.load();
    } catch (error) {
      const bridgeError = asBridgeError(error);
      return name === HEALTH_TOOL ? unhealthyResult(bridgeError, performance.now() - started) : errorResult(bridgeError);
    }

    const entry = catalog.get(name);
    if (!entry) {
      const known = [...catalog.keys()].join(", ");
      return errorResult(new BridgeError("PIPELINE_NOT_FOUND", `Unknown tool ${JSON.stringify(name)}; available tools: ${known}`));
    }

    const { technique } = entry.spec.bridge;
    const failure = entry.validate(args);
    if (failure) {
      this.recordFrontEndFailure(name, technique, started, failure.code);
      return errorResult(new BridgeError(failure.code, failure.message, { errors: failure.errors }));
    }

    try {
      const result = technique
        ? await this.bridge.request("execute", { technique, arguments: args })
        : await this.bridge.request(entry.spec.bridge.method, args);
      return successResult(result);
    } catch (error) {
      const bridgeError = asBridgeError(error);
      if (FRONT_END_CODES.has(bridgeError.code)) this.recordFrontEndFailure(name, technique, started, bridgeError.code);
      return name === HEALTH_TOOL ? unhealthyResult(bridgeError, performance.now() - started) : errorResult(bridgeError);
    }
  }

  /** Calls that failed here never completed at the worker, but they still belong in rag_metrics. */
  private recordFrontEndFailure(tool: string, technique: string | undefined, started: number, code: string): void {
    this.bridge
      .request("record_call", {
        tool,
        technique: technique ?? null,
        duration_ms: performance.now() - started,
        success: false,
        error_code: code,
      })
      .catch((error: unknown) => console.error(`[iris-rag] record_call failed: ${asBridgeError(error).message}`));
  }
}
