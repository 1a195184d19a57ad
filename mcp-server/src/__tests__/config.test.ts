import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { ConfigError, loadConfig, loadDotenv, parseDotenv } from "../config.js";
import { config, freshDataDir } from "./helpers.js";

const scratch = (): string => mkdtempSync(join(tmpdir(), "iris-rag-config-"));

describe("parseDotenv: a .env read as the CLI reads it (python-dotenv, no ${VAR} expansion)", () => {
  it("takes KEY=value lines, quotes, export, comments and literal dollars", () => {
    const text = [
      "# a comment",
      "export LLM_MODEL='my model' # after the value",
      'LLM_BASE_URL="http://h/${HOME}/v1"',
      "EMBEDDING_DIMENSIONS=",
      "RAG_DEFAULT_COLLECTION=notes  # inline",
      "NOT_A_SETTING",
      "  SPACED = value with spaces  ",
      'ESCAPED="a\\nb \\"q\\""',
      "SINGLE='it\\'s'",
      "HASH=a#b",
      'UNTERMINATED="open',
      "AFTER=1",
    ].join("\n");
    assert.deepEqual(
      Object.fromEntries(parseDotenv(text)),
      {
        LLM_MODEL: "my model",
        LLM_BASE_URL: "http://h/${HOME}/v1",
        EMBEDDING_DIMENSIONS: "",
        RAG_DEFAULT_COLLECTION: "notes",
        SPACED: "value with spaces",
        ESCAPED: 'a\nb "q"',
        SINGLE: "it's",
        HASH: "a#b",
        AFTER: "1",
      },
    );
  });
});

describe("loadDotenv: the environment over the repository's .env", () => {
  it("fills what the environment leaves unset or empty, keeps what it sets, skips the file's empty values", () => {
    const folder = scratch();
    const file = join(folder, ".env");
    writeFileSync(file, "REQUEST_TIMEOUT_MS=5000\nMCP_TRANSPORT=http\nCHUNK_SIZE=800\nLOG_LEVEL=\nRAG_TECHNIQUES=basic\n");
    const env: NodeJS.ProcessEnv = { REQUEST_TIMEOUT_MS: "7000", MCP_TRANSPORT: " ", LOG_LEVEL: "DEBUG" };
    loadDotenv(env, file);
    // CHUNK_SIZE is the worker's: it reaches the worker with the rest of this environment.
    assert.deepEqual(env, { REQUEST_TIMEOUT_MS: "7000", MCP_TRANSPORT: "http", LOG_LEVEL: "DEBUG", CHUNK_SIZE: "800", RAG_TECHNIQUES: "basic" });
    assert.equal(loadConfig(env).transport, "http");
  });

  it("reads nothing when there is no .env, and names one it cannot read", () => {
    const env: NodeJS.ProcessEnv = {};
    loadDotenv(env, join(scratch(), ".env"));
    assert.deepEqual(env, {});
    const folder = join(scratch(), ".env");
    mkdirSync(folder);
    assert.throws(() => loadDotenv({}, folder), (error: unknown) => error instanceof ConfigError && /^could not read .*\.env: EISDIR/.test(error.message));
  });
});

describe("loadConfig: an empty variable means its default, a bad one is a ConfigError naming it", () => {
  it("reports the package.json version, or the package's when there is none", () => {
    assert.match(loadConfig({ MCP_SERVER_VERSION: "" }).serverVersion, /^\d+\.\d+\.\d+/);
    // An installed package has no package.json (iris-rag mcp sets MCP_SERVER_VERSION): never a crash.
    assert.equal(loadConfig({}, scratch()).serverVersion, "0.0.0");
    assert.equal(loadConfig({ MCP_SERVER_VERSION: "9.9" }, scratch()).serverVersion, "9.9");
  });

  it("refuses a port outside 0-65535 and a number that is not one", () => {
    assert.equal(loadConfig({ MCP_SERVER_PORT: "0" }).http.port, 0);
    assert.equal(loadConfig({ MCP_SERVER_PORT: "65535" }).http.port, 65535);
    assert.throws(() => loadConfig({ MCP_SERVER_PORT: "99999" }), new ConfigError('MCP_SERVER_PORT must be an integer from 0 to 65535, got "99999"'));
    assert.throws(() => loadConfig({ REQUEST_TIMEOUT_MS: "abc" }), new ConfigError('REQUEST_TIMEOUT_MS must be an integer >= 1, got "abc"'));
    assert.throws(() => loadConfig({ MCP_TRANSPORT: "tcp" }), ConfigError);
  });
});

describe("the server's start with a bad setting", () => {
  const start = (env: NodeJS.ProcessEnv) =>
    spawnSync(process.execPath, [join(config.repoRoot, "mcp-server", "dist", "index.js")], {
      env: { ...process.env, ...env },
      input: "",
      encoding: "utf8",
      timeout: 30_000,
    });

  it("exits 1 with one line naming the variable, no stack trace", () => {
    for (const [env, named] of [
      [{ REQUEST_TIMEOUT_MS: "abc" }, "REQUEST_TIMEOUT_MS must be an integer >= 1"],
      [{ MCP_TRANSPORT: "http", MCP_SERVER_PORT: "99999" }, "MCP_SERVER_PORT must be an integer from 0 to 65535"],
    ] as const) {
      const run = start(env);
      assert.equal(run.status, 1);
      assert.equal(run.stdout, "");
      assert.equal(run.stderr.trim().split("\n").length, 1, run.stderr);
      assert.ok(run.stderr.startsWith(`[iris-rag] fatal: ${named}`), run.stderr);
    }
  });

  it("names RAG_AUTH_FILE and the file, MCP_SERVER_HOST or MCP_SERVER_PORT in one line when HTTP mode cannot start", async () => {
    const folder = scratch();
    const missing = join(folder, "missing.json");
    const notJson = join(folder, "not-json.json");
    writeFileSync(notJson, "{bad");
    const badPrincipal = join(folder, "bad-principal.json");
    writeFileSync(badPrincipal, JSON.stringify({ principals: [{ id: "alice", key_sha256: "k1", scopes: ["read"], collections: ["*"] }] }));
    const good = join(folder, "principals.json");
    writeFileSync(good, JSON.stringify({ principals: [] }));
    // A port already taken, for the start that cannot listen on it.
    const taken = createNetServer();
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve));
    const port = (taken.address() as AddressInfo).port;
    try {
      for (const [env, named] of [
        [{ RAG_AUTH_FILE: missing }, `RAG_AUTH_FILE ${missing} could not be read: ENOENT`],
        [{ RAG_AUTH_FILE: notJson }, `RAG_AUTH_FILE ${notJson} is invalid: not JSON (`],
        [{ RAG_AUTH_FILE: badPrincipal }, `RAG_AUTH_FILE ${badPrincipal} is invalid: principals[0].key_sha256 must be`],
        [{ MCP_SERVER_HOST: "0.0.0.0" }, "MCP_SERVER_HOST 0.0.0.0 is not a loopback address: refusing to serve MCP there without authentication"],
        [{ MCP_SERVER_HOST: "no.such.host.invalid", RAG_AUTH_FILE: good }, "MCP_SERVER_HOST no.such.host.invalid: cannot listen there (getaddrinfo ENOTFOUND"],
        [{ MCP_SERVER_PORT: String(port) }, `MCP_SERVER_PORT ${port}: cannot listen on 127.0.0.1:${port} (listen EADDRINUSE`],
      ] as const) {
        const run = start({ MCP_TRANSPORT: "http", MCP_SERVER_PORT: "0", RAG_DATA_DIR: freshDataDir(), ...env });
        assert.equal(run.status, 1, run.stderr);
        assert.equal(run.stdout, "");
        assert.equal(run.stderr.trim().split("\n").length, 1, run.stderr);
        assert.ok(run.stderr.startsWith(`[iris-rag] fatal: ${named}`), run.stderr);
      }
    } finally {
      taken.close();
    }
  });
});
