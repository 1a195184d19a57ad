/**
 * MCP_TRANSPORT=http: MCP over the SDK's Streamable HTTP transport at /mcp, and GET /health.
 *
 * Every session gets its own MCP server object, all of them on the one worker and tool router (so the
 * concurrency limits, the queue and the per-key rate limits are global). In front of the transport this
 * file does what the transport leaves to the application: the Origin check against DNS rebinding, the
 * body-size cap, API keys (auth.ts), and binding each session to the key that opened it.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server as NodeHttpServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";

import { presentedKey, PrincipalRegistry, type Principal } from "./auth.js";
import type { HttpConfig } from "./config.js";
import { isObject } from "./json.js";
import type { IrisRagServer } from "./server.js";

interface Session {
  transport: StreamableHTTPServerTransport;
  server: Server;
  /** The key that opened the session; another key cannot use it. null: no keys configured. */
  principalId: string | null;
  lastSeen: number;
}

const LOOPBACK_HOSTS = new Set(["localhost", "127.0.0.1", "::1", "[::1]"]);

export const isLoopback = (host: string): boolean => LOOPBACK_HOSTS.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host);

/** A JSON-RPC error as an HTTP answer (the shape the SDK's transport uses for its own refusals). */
function refuse(res: ServerResponse, status: number, message: string, headers: Record<string, string> = {}): void {
  if (res.headersSent) return;
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

export class HttpFrontDoor {
  private readonly sessions = new Map<string, Session>();
  private readonly registry: PrincipalRegistry | null;
  private readonly http: NodeHttpServer;
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly core: IrisRagServer,
    private readonly config: HttpConfig,
  ) {
    this.registry = config.authFile ? new PrincipalRegistry(config.authFile) : null;
    if (!this.registry && !isLoopback(config.host)) {
      throw new Error(
        `refusing to serve MCP on ${config.host} without authentication: set RAG_AUTH_FILE (see README, "HTTP service"), or listen on 127.0.0.1`,
      );
    }
    this.http = createServer((req, res) => {
      this.route(req, res).catch((error: unknown) => {
        console.error(`[iris-rag] HTTP ${req.method} ${req.url}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
        refuse(res, 500, "Internal server error");
      });
    });
    this.sweeper = setInterval(() => this.closeIdleSessions(), Math.min(60_000, config.sessionIdleMs)).unref();
  }

  /** Listen; resolves with the bound address (port 0 picks a free one). */
  listen(): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      this.http.once("error", reject);
      this.http.listen(this.config.port, this.config.host, () => resolve(this.http.address() as AddressInfo));
    });
  }

  get principals(): number {
    return this.registry?.size ?? 0;
  }

  async close(): Promise<void> {
    clearInterval(this.sweeper);
    await Promise.all([...this.sessions.values()].map((session) => session.transport.close().catch(() => undefined)));
    this.http.closeAllConnections();
    await new Promise<void>((resolve) => this.http.close(() => resolve()));
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? "/", "http://host").pathname;
    if (path === "/health") {
      if (req.method !== "GET" && req.method !== "HEAD") return refuse(res, 405, "GET /health", { allow: "GET, HEAD" });
      return this.health(res);
    }
    if (path !== "/mcp") return refuse(res, 404, "Not found: MCP is served at /mcp, health at /health");

    // DNS rebinding: a browser page from another origin must not reach a server on this machine.
    const origin = req.headers.origin;
    if (origin !== undefined && !this.originAllowed(origin)) {
      return refuse(res, 403, `Origin ${JSON.stringify(origin)} is not allowed (MCP_ALLOWED_ORIGINS)`);
    }

    let principal: Principal | null = null;
    if (this.registry) {
      principal = this.registry.authenticate(presentedKey(req.headers));
      if (!principal) {
        return refuse(res, 401, "UNAUTHORIZED: send a valid key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'", {
          "www-authenticate": 'Bearer realm="iris-rag"',
        });
      }
    }

    let body: unknown;
    if (req.method === "POST") {
      const read = await this.readBody(req, res);
      if (!read.ok) return;
      body = read.body;
    }

    const sessionId = req.headers["mcp-session-id"];
    const auth = principal && { token: "", clientId: principal.id, scopes: principal.scopes, extra: { principal } };
    const request = Object.assign(req, auth ? { auth } : {});
    if (typeof sessionId === "string") {
      const session = this.sessions.get(sessionId);
      // Another key's session is answered as an unknown one: nothing tells a caller it exists.
      if (!session || session.principalId !== (principal?.id ?? null)) return refuse(res, 404, "Session not found");
      session.lastSeen = Date.now();
      return session.transport.handleRequest(request, res, body);
    }
    if (req.method !== "POST" || !isObject(body) || !isInitializeRequest(body)) {
      return refuse(res, 400, "Bad Request: no valid session id (mcp-session-id); start with an initialize request");
    }
    const session = this.openSession(principal);
    await session.transport.handleRequest(request, res, body);
  }

  private openSession(principal: Principal | null): Session {
    const server = this.core.newServer();
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        this.sessions.set(id, session);
      },
    });
    const session: Session = { transport, server, principalId: principal?.id ?? null, lastSeen: Date.now() };
    transport.onclose = () => {
      if (transport.sessionId) this.sessions.delete(transport.sessionId);
      void server.close().catch(() => undefined);
    };
    void server.connect(transport);
    return session;
  }

  private originAllowed(origin: string): boolean {
    if (this.config.allowedOrigins.includes(origin)) return true;
    try {
      return isLoopback(new URL(origin).hostname);
    } catch {
      return false;
    }
  }

  /** The request body as JSON; on failure the answer (413, 400) is already sent. */
  private readBody(req: IncomingMessage, res: ServerResponse): Promise<{ ok: true; body: unknown } | { ok: false }> {
    const limit = this.config.maxBodyBytes;
    const tooLarge = () => refuse(res, 413, `Request body larger than ${limit} bytes (MCP_MAX_BODY_BYTES)`, { connection: "close" });
    const declared = Number(req.headers["content-length"]);
    if (Number.isFinite(declared) && declared > limit) {
      tooLarge();
      req.resume();
      return Promise.resolve({ ok: false });
    }
    return new Promise((resolve) => {
      const chunks: Buffer[] = [];
      let size = 0;
      let over = false;
      req.on("data", (chunk: Buffer) => {
        if (over) return;
        size += chunk.length;
        if (size > limit) {
          over = true;
          chunks.length = 0;
          tooLarge();
          resolve({ ok: false });
          return;
        }
        chunks.push(chunk);
      });
      req.on("end", () => {
        if (over) return;
        try {
          resolve({ ok: true, body: JSON.parse(Buffer.concat(chunks).toString("utf8")) });
        } catch (error) {
          refuse(res, 400, `Parse error: the body is not JSON (${(error as Error).message})`);
          resolve({ ok: false });
        }
      });
      req.on("error", () => resolve({ ok: false }));
    });
  }

  /** GET /health: rag_health_check's status and each component's, no details; 503 only when unhealthy. */
  private async health(res: ServerResponse): Promise<void> {
    const result = await this.core.tools.callTool("rag_health_check", { include_details: false });
    const report = isObject(result.structuredContent) ? result.structuredContent : {};
    const status = typeof report.status === "string" ? report.status : "unhealthy";
    const components = isObject(report.components) ? report.components : {};
    const body = {
      status,
      timestamp: report.timestamp ?? new Date().toISOString(),
      components: Object.fromEntries(
        Object.entries(components).map(([name, value]) => [name, { status: isObject(value) ? value.status : "unknown" }]),
      ),
      sessions: this.sessions.size,
    };
    res.writeHead(status === "unhealthy" ? 503 : 200, { "content-type": "application/json", "cache-control": "no-store" });
    res.end(JSON.stringify(body));
  }

  private closeIdleSessions(): void {
    const cutoff = Date.now() - this.config.sessionIdleMs;
    for (const session of this.sessions.values()) {
      if (session.lastSeen < cutoff) void session.transport.close().catch(() => undefined);
    }
  }
}
