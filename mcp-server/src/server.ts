import { readFileSync } from "node:fs";
import { join } from "node:path";

import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

import { WorkerBridge } from "./bridge.js";
import type { Config } from "./config.js";
import { loadToolSpecs, servedToolSpecs } from "./schemas.js";
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
    cancelGraceMs: config.cancelGraceMs,
  });
  // The tool table comes from the schema files, not the worker: a worker that cannot start leaves the
  // client its tools, and rag_health_check to say why.
  const specs = servedToolSpecs(loadToolSpecs(join(config.repoRoot, "iris_rag", "schemas")), config.servedTechniques);
  const tools = new ToolRouter(bridge, specs);
  const server = new Server({ name: "iris-rag", version: packageVersion(config.repoRoot) }, { capabilities: { tools: {} } });

  server.setRequestHandler(ListToolsRequestSchema, () => ({ tools: tools.listTools() }));
  // extra.signal fires on the client's notifications/cancelled; the SDK then sends no response.
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) =>
    tools.callTool(request.params.name, request.params.arguments, extra.signal),
  );

  let cleaning: Promise<void> | undefined;
  const cleanup = () =>
    (cleaning ??= (async () => {
      await server.close().catch((error: unknown) => console.error(`[iris-rag] closing the MCP connection: ${String(error)}`));
      await bridge.stop();
    })());
  return { server, bridge, tools, cleanup };
}
