import { existsSync, readFileSync } from "node:fs";
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
  /** MCP_SERVER_NAME / MCP_SERVER_VERSION: what `initialize` reports (defaults: iris-rag, package.json's). */
  serverName: string;
  serverVersion: string;
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

/** A setting the server cannot start with: index.ts prints its message alone, one line naming the variable. */
export class ConfigError extends Error {}

// python-dotenv's grammar (iris_rag.settings.read_dotenv reads the same file for the CLI), without ${VAR}
// expansion: each pattern is tried where the previous one stopped.
const DOTENV = {
  space: /\s*/y,
  export: /(?:export[^\S\r\n]+)?/y,
  quotedKey: /'([^']+)'/y,
  key: /([^=#\s]+)/y,
  blank: /[^\S\r\n]*/y,
  equals: /(=[^\S\r\n]*)/y,
  singleQuoted: /'((?:\\.|[^'\\])*)'/sy,
  doubleQuoted: /"((?:\\.|[^"\\])*)"/sy,
  unquoted: /([^\r\n]*)/y,
  comment: /(?:[^\S\r\n]*#[^\r\n]*)?/y,
  endOfLine: /[^\S\r\n]*(?:\r\n|\n|\r|$)/y,
  restOfLine: /[^\r\n]*(?:\r\n|\n|\r)?/y,
};
const ESCAPES: Record<string, string> = { a: "\x07", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t", v: "\v" };

/** The KEY=value bindings of a .env file's text (a line without `=`, or one that cannot be read, binds nothing). */
export function parseDotenv(text: string): Map<string, string> {
  const source = text.replace(/^\uFEFF/, "");
  const bindings = new Map<string, string>();
  let at = 0;
  const read = (pattern: RegExp): string | null => {
    pattern.lastIndex = at;
    const match = pattern.exec(source);
    if (match === null) return null;
    at = pattern.lastIndex;
    return match[1] ?? "";
  };
  const value = (): string | null => {
    const quote = source[at];
    if (quote === "'") return read(DOTENV.singleQuoted)?.replace(/\\([\\'])/g, "$1") ?? null;
    if (quote === '"') return read(DOTENV.doubleQuoted)?.replace(/\\([\\'"abfnrtv])/g, (_, c: string) => ESCAPES[c] ?? c) ?? null;
    return (read(DOTENV.unquoted) ?? "").replace(/\s+#.*/, "").trimEnd();
  };
  while (at < source.length) {
    read(DOTENV.space);
    if (at >= source.length) break;
    read(DOTENV.export);
    const key = source[at] === "#" ? undefined : read(source[at] === "'" ? DOTENV.quotedKey : DOTENV.key);
    read(DOTENV.blank);
    let bound: string | null | undefined;
    if (key !== null && source[at] === "=") {
      const equals = read(DOTENV.equals) ?? "=";
      // `KEY= # note` is empty with a comment; `KEY=#x` is the value #x.
      bound = equals.length > 1 && source[at] === "#" ? "" : value();
    }
    if (key === null || bound === null || read(DOTENV.comment) === null || read(DOTENV.endOfLine) === null) {
      read(DOTENV.restOfLine);
    } else if (key !== undefined && bound !== undefined) {
      bindings.set(key, bound);
    }
  }
  return bindings;
}

/**
 * Read the .env file into `env` (process.env): the values of the variables it leaves unset or empty (the
 * environment wins; a file's empty value means the default). The worker inherits the result, so it gets
 * exactly what the front end read. The file is the repository root's, where the worker runs whatever folder
 * the client starts the server from; for an installed package that is site-packages, so `iris-rag mcp` has
 * read the user's .env (the folder it starts in) into the environment already (iris_rag/launcher.py).
 */
export function loadDotenv(env: NodeJS.ProcessEnv = process.env, file: string = join(REPO_ROOT, ".env")): void {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return;
    throw new ConfigError(`could not read ${file}: ${code ?? String(error)}`);
  }
  for (const [name, value] of parseDotenv(text)) {
    if (value.trim() && !env[name]?.trim()) env[name] = value;
  }
}

function integer(env: NodeJS.ProcessEnv, name: string, fallback: number, min = 1, max = Number.MAX_SAFE_INTEGER): number {
  const raw = env[name]?.trim();
  if (!raw) return fallback;
  const value = Number(raw);
  // Fail at start rather than run with a limit nobody asked for.
  if (!Number.isInteger(value) || value < min || value > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `from ${min} to ${max}`;
    throw new ConfigError(`${name} must be an integer ${range}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

/** package.json's version; an installed package has none (`iris-rag mcp` sets MCP_SERVER_VERSION). */
function packageVersion(repoRoot: string): string {
  try {
    const { version } = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { version?: unknown };
    return typeof version === "string" && version ? version : "0.0.0";
  } catch {
    return "0.0.0";
  }
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
    serverVersion: env.MCP_SERVER_VERSION?.trim() || packageVersion(repoRoot),
    transport: transport(env.MCP_TRANSPORT),
    http: {
      host: env.MCP_SERVER_HOST?.trim() || "127.0.0.1",
      // 0: a free port the system picks (the start line says which).
      port: integer(env, "MCP_SERVER_PORT", 3000, 0, 65535),
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
  if (value !== "stdio" && value !== "http") throw new ConfigError(`MCP_TRANSPORT must be stdio or http, got ${JSON.stringify(raw)}`);
  return value;
}
