#!/usr/bin/env node
/**
 * Entry point: an MCP server on stdio (default) or on Streamable HTTP (MCP_TRANSPORT=http).
 * On stdio, stdout carries the protocol only, so every log goes to stderr (in both modes).
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

import { ConfigError, loadConfig, loadDotenv, type Config } from "./config.js";
import { BridgeError } from "./errors.js";
import { gatedInput } from "./frames.js";
import { HttpFrontDoor } from "./http.js";
import { createServer, type IrisRagServer } from "./server.js";

/** The longest a shutdown may take (the worker's own grace is 3 s, then the answers are written). */
const SHUTDOWN_LIMIT_MS = 10_000;

async function main(): Promise<void> {
  loadDotenv();
  const config = loadConfig();
  const core = createServer(config);
  let close: () => Promise<void> = async () => undefined;
  let exiting = false;
  const shutdown = (reason: string) => {
    if (exiting) return;
    exiting = true;
    console.error(`[iris-rag] shutting down (${reason})`);
    // Bounded whatever hangs: the worker is killed after its grace, and this exits even if that fails.
    setTimeout(() => {
      console.error(`[iris-rag] still shutting down after ${SHUTDOWN_LIMIT_MS} ms: exiting`);
      process.exit(0);
    }, SHUTDOWN_LIMIT_MS).unref();
    void close()
      .catch((error: unknown) => console.error(`[iris-rag] closing: ${String(error)}`))
      .then(() => core.cleanup())
      .finally(() => process.exit(0));
  };
  process.once("SIGTERM", () => shutdown("SIGTERM"));
  process.once("SIGINT", () => shutdown("SIGINT"));
  close = config.transport === "http" ? await serveHttp(config, core) : await serveStdio(config, core, shutdown);
  // Start the worker now, so the first call does not wait for Python to start.
  core.tools
    .warmUp(config.workerStartTimeoutMs)
    .catch((error: unknown) =>
      console.error(
        error instanceof BridgeError && error.details?.worker === "starting"
          ? `[iris-rag] the worker is still starting after ${config.workerStartTimeoutMs} ms (a store upgrade or a model load: its log says which); calls wait for it up to REQUEST_TIMEOUT_MS`
          : `[iris-rag] the worker did not start (a call will try again): ${String(error)}`,
      ),
    );
}

async function serveStdio(config: Config, core: IrisRagServer, shutdown: (reason: string) => void): Promise<() => Promise<void>> {
  const server = core.newServer();
  process.stdin.once("end", () => shutdown("stdin closed"));
  server.onclose = () => shutdown("connection closed");
  await server.connect(new StdioServerTransport(gatedInput(process.stdin, process.stdout), process.stdout));
  console.error(`[iris-rag] MCP server ready on stdio (worker: ${config.python} -m iris_rag.bridge in ${config.repoRoot})`);
  return () => server.close();
}

async function serveHttp(config: Config, core: IrisRagServer): Promise<() => Promise<void>> {
  const door = new HttpFrontDoor(core, config.http);
  const address = await door.listen();
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  const keys = config.http.authFile ? `${door.principals} API key(s) from RAG_AUTH_FILE` : "no API keys (loopback only)";
  console.error(`[iris-rag] MCP server ready on http://${host}:${address.port}/mcp (health: /health; ${keys})`);
  // Stop the worker before the streams close: it answers every call in progress, and those answers must
  // reach the clients (closing the transports first left each call an empty 200 and its client waiting).
  return () => door.close(() => core.cleanup());
}

main().catch((error: unknown) => {
  // A bad setting is the user's to fix: its one line says which; anything else is a bug, with its stack.
  const text = error instanceof ConfigError ? error.message : error instanceof Error ? (error.stack ?? error.message) : String(error);
  console.error(`[iris-rag] fatal: ${text}`);
  process.exit(1);
});
