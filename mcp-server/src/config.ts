import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { parseTechniques } from "./schemas.js";

/** Everything the front end reads from the environment, parsed once at start. */
export interface Config {
  /** The repository root: the worker runs here so `-m iris_rag.bridge` resolves. */
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
}

/** Two levels up from mcp-server/dist/ (or mcp-server/src/ when run from source). */
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
  };
}
