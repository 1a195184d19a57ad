#!/usr/bin/env node
/** Entry point: an MCP server on stdio. stdout carries the protocol only, so every log goes to stderr. */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

import { loadConfig } from "./config.js";
import { gatedInput } from "./frames.js";
import { createServer } from "./server.js";

async function main(): Promise<void> {
  const config = loadConfig();
  const { server, tools, cleanup } = createServer(config);

  let exiting = false;
  const shutdown = (reason: string) => {
    if (exiting) return;
    exiting = true;
    console.error(`[iris-rag] shutting down (${reason})`);
    void cleanup().finally(() => process.exit(0));
  };
  process.stdin.once("end", () => shutdown("stdin closed"));
  process.once("SIGTERM", () => shutdown("SIGTERM"));
  process.once("SIGINT", () => shutdown("SIGINT"));
  server.onclose = () => shutdown("connection closed");

  await server.connect(new StdioServerTransport(gatedInput(process.stdin, process.stdout), process.stdout));
  // Start the worker now, so the first call does not wait for Python to start.
  tools.warmUp(config.workerStartTimeoutMs).catch((error: unknown) => console.error(`[iris-rag] the worker did not start (a call will try again): ${String(error)}`));
  console.error(`[iris-rag] MCP server ready on stdio (worker: ${config.python} -m iris_rag.bridge in ${config.repoRoot})`);
}

main().catch((error: unknown) => {
  console.error(`[iris-rag] fatal: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
  process.exit(1);
});
