import { join } from "node:path";

import type { AuthInfo } from "@modelcontextprotocol/sdk/server/auth/types.js";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import {
  CallToolRequestSchema,
  ErrorCode,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

import { RateLimiter, type Principal } from "./auth.js";
import { WorkerBridge, type Progress } from "./bridge.js";
import type { Config } from "./config.js";
import { loadInstructions, loadToolSpecs, servedToolSpecs } from "./schemas.js";
import { RESOURCE_TEMPLATES, ResourceRouter } from "./resources.js";
import { ToolRouter } from "./tools.js";

export interface IrisRagServer {
  bridge: WorkerBridge;
  tools: ToolRouter;
  /** The per-key token buckets every session spends from (tools/call, resources, new HTTP sessions). */
  limiter: RateLimiter;
  /** A new MCP server on the shared worker: one for stdio, one per session over HTTP. */
  newServer: () => Server;
  /** Stop the worker (close the MCP servers first). */
  cleanup: () => Promise<void>;
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
  const schemaDir = join(config.repoRoot, "iris_rag", "schemas");
  const specs = servedToolSpecs(loadToolSpecs(schemaDir), config.servedTechniques);
  const instructions = loadInstructions(schemaDir);
  // Every connected session hears notifications/resources/list_changed after any session's write.
  const live = new Set<Server>();
  const announceChange = (): void => {
    for (const server of live) {
      server.sendResourceListChanged().catch((error: unknown) => console.error(`[iris-rag] could not send list_changed: ${String(error)}`));
    }
  };
  // One bucket per key for everything that makes the worker work: a key past its tools/call budget must
  // not go on reading the same documents through resources/read.
  const limiter = new RateLimiter();
  const tools = new ToolRouter(bridge, specs, announceChange, limiter);
  const resources = new ResourceRouter(bridge, limiter);

  const newServer = (): Server => {
    const server = new Server({ name: config.serverName, version: config.serverVersion }, { capabilities: { tools: {}, resources: { listChanged: true } }, instructions });
    server.setRequestHandler(ListToolsRequestSchema, (request) => {
      refuseCursor(request);
      return { tools: tools.listTools() };
    });
    server.setRequestHandler(ListResourcesRequestSchema, async (request, extra) => {
      refuseCursor(request);
      return { resources: await resources.list(principalOf(extra.authInfo)) };
    });
    server.setRequestHandler(ListResourceTemplatesRequestSchema, (request) => {
      refuseCursor(request);
      return { resourceTemplates: RESOURCE_TEMPLATES };
    });
    server.setRequestHandler(ReadResourceRequestSchema, async (request, extra) => resources.read(request.params.uri, principalOf(extra.authInfo)));
    live.add(server);
    const closed = server.onclose;
    server.onclose = () => {
      live.delete(server);
      closed?.();
    };
    // extra.signal fires on the client's notifications/cancelled; the SDK then sends no response.
    // extra.authInfo is what the HTTP front door authenticated (http.ts); none on stdio.
    server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
      // A client that sent a progressToken gets each step of the call (an ingest's batches) as it happens.
      const token = request.params._meta?.progressToken;
      const onProgress =
        token === undefined
          ? undefined
          : ({ progress, message }: Progress) =>
              void extra
                .sendNotification({ method: "notifications/progress", params: { progressToken: token, progress, message } })
                .catch((error: unknown) => console.error(`[iris-rag] could not send progress: ${String(error)}`));
      return tools.callTool(request.params.name, request.params.arguments, extra.signal, principalOf(extra.authInfo), onProgress);
    });
    return server;
  };

  let cleaning: Promise<void> | undefined;
  const cleanup = () => (cleaning ??= bridge.stop());
  return { bridge, tools, limiter, newServer, cleanup };
}

/**
 * These lists come whole, in one page with no nextCursor, so this server never issued a cursor: any cursor
 * is invalid, and MCP 2025-06-18 (pagination) says an invalid cursor SHOULD be -32602, not ignored.
 */
function refuseCursor(request: { method: string; params?: { cursor?: string } }): void {
  const cursor = request.params?.cursor;
  if (cursor === undefined) return;
  throw new McpError(
    ErrorCode.InvalidParams,
    `invalid cursor ${JSON.stringify(cursor.slice(0, 100))}: ${request.method} returns its whole list in one page and issues no cursor; call it without one`,
  );
}

/** The principal http.ts attached to the request (AuthInfo.extra.principal). */
function principalOf(authInfo: AuthInfo | undefined): Principal | undefined {
  const principal = authInfo?.extra?.principal;
  return principal === undefined ? undefined : (principal as Principal);
}
