import { readFileSync } from "node:fs";
import { join } from "node:path";

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { CallToolRequestSchema, ErrorCode, ListToolsRequestSchema, McpError } from "@modelcontextprotocol/sdk/types.js";

import { WorkerBridge } from "./bridge.js";
import type { Config } from "./config.js";
import { asBridgeError } from "./errors.js";
import { ToolRouter } from "./tools.js";

export interface IrisRagServer {
  server: Server;
  bridge: WorkerBridge;
  tools: ToolRouter;
  /** Close the MCP connection and stop the worker. */
  cleanup: () => Promise<void>;
}

function packageVersion(repoRoot: string): string {
  const { version } = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { version?: string };
  return version ?? "0.0.0";
}

export function createServer(config: Config): IrisRagServer {
  const bridge = new WorkerBridge({
    python: config.python,
    cwd: config.repoRoot,
    requestTimeoutMs: config.requestTimeoutMs,
    maxConcurrentRequests: config.maxConcurrentRequests,
    maxQueuedRequests: config.maxQueuedRequests,
  });
  const tools = new ToolRouter(bridge, config.workerStartTimeoutMs);
  const server = new Server({ name: "iris-rag", version: packageVersion(config.repoRoot) }, { capabilities: { tools: {} } });

  server.setRequestHandler(ListToolsRequestSchema, async () => {
    try {
      return { tools: await tools.listTools() };
    } catch (error) {
      // No tool table without the worker: say why, in the same terms as a failed tool call.
      const { code, message, hint } = asBridgeError(error);
      throw new McpError(ErrorCode.InternalError, `${code}: ${message}. ${hint}`);
    }
  });
  server.setRequestHandler(CallToolRequestSchema, async (request) =>
    tools.callTool(request.params.name, request.params.arguments),
  );

  let cleaning: Promise<void> | undefined;
  const cleanup = () =>
    (cleaning ??= (async () => {
      await server.close().catch((error: unknown) => console.error(`[iris-rag] closing the MCP connection: ${String(error)}`));
      await bridge.stop();
    })());
  return { server, bridge, tools, cleanup };
}
