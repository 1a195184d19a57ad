import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { parseTechniques } from "./schemas.js";

/** Everything the front end reads from the environment, parsed once at start. */
export interface Config {
  /** The repository root (site-packages for the bundle): the worker runs here so `-m iris_rag.bridge` resolves. */
  repoRoot: string;
  /** Python executable that runs the worker. */
  python: string;
  requestTimeoutMs: number;
  maxConcurrentRequests: number;
  maxQueuedRequests: number;
  /** Limit for the worker's first answer (`describe`), which includes the Python start. */
  workerStartTimeoutMs: number;
  /** How long a timed-out or cancelled call keeps its slot while the worker stops it. */
  cancelGraceMs: number;
  /** RAG_TECHNIQUES: the techniques whose tools are listed; null for all. */
  servedTechniques: string[] | null;
  /** MCP_SERVER_NAME / MCP_SERVER_VERSION: what `initialize` reports (defaults: iris-rag, package.json). */
  serverName: string;
  serverVersion: string | null;
  transport: "stdio" | "http";
  http: HttpConfig;
}

/** MCP_TRANSPORT=http: where and how the Streamable HTTP endpoint listens. */
export interface HttpConfig {
  host: string;
  port: number;
  /** RAG_AUTH_FILE: the principals file; null serves without keys (loopback only). */
  authFile: string | null;
  /** MCP_ALLOWED_ORIGINS: browser origins allowed besides the loopback ones (comma-separated). */
  allowedOrigins: string[];
  /** MCP_MAX_BODY_BYTES: larger request bodies get 413. */
  maxBodyBytes: number;
  /** MCP_SESSION_IDLE_MS: a session unused this long is closed. */
  sessionIdleMs: number;
  /** MCP_MAX_SESSIONS_PER_KEY: live sessions one key may hold (without keys: all clients together). */
  maxSessionsPerKey: number;
}

/**
 * The folder holding iris_rag/: two levels up from mcp-server/dist/ (or mcp-server/src/ when run from
 * source), and from iris_rag/frontend/server.mjs, the bundle an installed package runs (site-packages).
 */
export const REPO_ROOT = resolve(fileURLToPath(new URL("../../", import.meta.url)));

function integer(env: NodeJS.ProcessEnv, name: string, fallback: number, min = 1): number {
  const raw = env[name]?.trim();
  if (!raw) return fallback;
  const value = Number(raw);
  // Fail at start rather than run with a limit nobody asked for.
  if (!Number.isInteger(value) || value < min) {
    throw new Error(`${name} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env, repoRoot: string = REPO_ROOT): Config {
  const venvPython = join(repoRoot, ".venv", "bin", "python");
  return {
    repoRoot,
    python: env.IRIS_RAG_PYTHON?.trim() || (existsSync(venvPython) ? venvPython : "python3"),
    requestTimeoutMs: integer(env, "REQUEST_TIMEOUT_MS", 60_000),
    maxConcurrentRequests: integer(env, "MAX_CONCURRENT_REQUESTS", 8),
    maxQueuedRequests: integer(env, "MAX_QUEUED_REQUESTS", 100, 0),
    workerStartTimeoutMs: integer(env, "WORKER_START_TIMEOUT_MS", 30_000),
    cancelGraceMs: integer(env, "CANCEL_GRACE_MS", 30_000),
    servedTechniques: parseTechniques(env.RAG_TECHNIQUES),
    serverName: env.MCP_SERVER_NAME?.trim() || "iris-rag",
    serverVersion: env.MCP_SERVER_VERSION?.trim() || null,
    transport: transport(env.MCP_TRANSPORT),
    http: {
      host: env.MCP_SERVER_HOST?.trim() || "127.0.0.1",
      port: integer(env, "MCP_SERVER_PORT", 3000, 0),
      authFile: env.RAG_AUTH_FILE?.trim() || null,
      allowedOrigins: (env.MCP_ALLOWED_ORIGINS ?? "")
        .split(",")
        .map((origin) => origin.trim())
        .filter(Boolean),
      maxBodyBytes: integer(env, "MCP_MAX_BODY_BYTES", 4 * 1024 * 1024),
      sessionIdleMs: integer(env, "MCP_SESSION_IDLE_MS", 30 * 60_000),
      maxSessionsPerKey: integer(env, "MCP_MAX_SESSIONS_PER_KEY", 32),
    },
  };
}

function transport(raw: string | undefined): "stdio" | "http" {
  const value = raw?.trim().toLowerCase() || "stdio";
  if (value !== "stdio" && value !== "http") throw new Error(`MCP_TRANSPORT must be stdio or http, got ${JSON.stringify(raw)}`);
  return value;
}
