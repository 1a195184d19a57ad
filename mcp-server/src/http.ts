/**
 * MCP_TRANSPORT=http: MCP over the SDK's Streamable HTTP transport at /mcp, and GET /health.
 *
 * Every session gets its own MCP server object, all of them on the one worker and tool router (so the
 * concurrency limits, the queue and the per-key rate limits are global). In front of the transport this
 * file does what the transport leaves to the application: the Origin check against DNS rebinding, the
 * body-size cap, API keys (auth.ts), binding each session to the key that opened it, and what a new session
 * costs: a token from the key's bucket and one of its MCP_MAX_SESSIONS_PER_KEY places (the key's least
 * recently used idle session is closed to make room). A session with a call in progress is busy: neither the
 * cap nor the idle sweeper closes it, since that would cancel the call and leave its client no answer.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server as NodeHttpServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import type { TransportSendOptions } from "@modelcontextprotocol/sdk/shared/transport.js";
import {
  type CallToolResult,
  isInitializeRequest,
  isJSONRPCErrorResponse,
  isJSONRPCNotification,
  isJSONRPCRequest,
  isJSONRPCResultResponse,
  type JSONRPCMessage,
  type MessageExtraInfo,
  type RequestId,
} from "@modelcontextprotocol/sdk/types.js";

import { presentedKey, PrincipalRegistry, rateLimitMessage, type Principal } from "./auth.js";
import { ConfigError, type HttpConfig } from "./config.js";
import { rejectMessage } from "./frames.js";
import { isObject } from "./json.js";
import type { IrisRagServer } from "./server.js";
import { delay, withinMs } from "./time.js";

interface Session {
  transport: SessionTransport;
  server: Server;
  /** The key that opened the session; another key cannot use it. null: no keys configured. */
  principalId: string | null;
  /** When the session's last HTTP request arrived. */
  lastSeen: number;
}

/** When the session was last used: its last request's arrival or its last call's end; null while it is busy. */
function idleSince({ transport, lastSeen }: Session): number | null {
  return transport.inProgress > 0 ? null : Math.max(lastSeen, transport.settledAt);
}

const LOOPBACK_HOSTS = new Set(["localhost", "127.0.0.1", "::1", "[::1]"]);

/** listen() errors that are the setting's to fix: a host that does not resolve or is not this machine's, a port taken or privileged. */
const HOST_ERRORS = new Set(["ENOTFOUND", "EAI_AGAIN", "EAI_FAIL", "EADDRNOTAVAIL"]);
const PORT_ERRORS = new Set(["EADDRINUSE", "EACCES"]);

/** How long one health check answers GET /health for. */
const HEALTH_REUSE_MS = 1_000;
/** Shutdown: how long the answers to the calls in progress may take to be written, once the worker is stopped. */
const ANSWER_GRACE_MS = 2_000;
/** Shutdown: how long open connections get to finish writing before they are cut. */
const FLUSH_GRACE_MS = 500;

const SHUTTING_DOWN = "The server is shutting down: send the request again once it is back";


/**
 * The SDK's transport, plus what it leaves open: the SSE stream of a request the client cancelled. The
 * server sends no response to a cancelled request (the SDK drops the handler's result, as the specification
 * says), and the transport ends a POST's stream only once every request it carried is answered, so the
 * stream stayed open, kept alive every 15 s, for the session's life. Here the stream ends once each request
 * it carried is answered or cancelled. It also counts the requests still unanswered, so that a shutdown can
 * wait for their answers before it closes the streams.
 */
class SessionTransport extends StreamableHTTPServerTransport {
  /** Each request not yet answered or cancelled -> the unsettled requests of its POST (one Set per POST). */
  private readonly unsettled = new Map<RequestId, Set<RequestId>>();
  /** The requests of each POST being dispatched (the SDK passes one requestInfo to all of them). */
  private readonly posts = new WeakMap<object, Set<RequestId>>();
  /** When a request was last answered or cancelled (0: never). */
  private lastSettled = 0;

  constructor(options: ConstructorParameters<typeof StreamableHTTPServerTransport>[0]) {
    super(options);
    // Server.connect() keeps this handler and calls it before its own, for every message of every POST.
    this.onmessage = (message: JSONRPCMessage, extra?: MessageExtraInfo) => this.observe(message, extra);
  }

  /** Requests this session has received and not yet answered (nor seen cancelled). */
  get inProgress(): number {
    return this.unsettled.size;
  }

  /** When a request was last answered or cancelled (0: never): a session is idle from then, not from its arrival. */
  get settledAt(): number {
    return this.lastSettled;
  }

  override async send(message: JSONRPCMessage, options?: TransportSendOptions): Promise<void> {
    try {
      await super.send(message, options);
    } finally {
      if ((isJSONRPCResultResponse(message) || isJSONRPCErrorResponse(message)) && message.id !== undefined) this.settle(message.id);
    }
  }

  private observe(message: JSONRPCMessage, extra?: MessageExtraInfo): void {
    if (isJSONRPCRequest(message)) {
      const key: object | undefined = extra?.requestInfo;
      let post = key && this.posts.get(key);
      if (!post) {
        post = new Set();
        if (key) this.posts.set(key, post);
      }
      post.add(message.id);
      this.unsettled.set(message.id, post);
    } else if (isJSONRPCNotification(message) && message.method === "notifications/cancelled") {
      const requestId: unknown = message.params?.requestId;
      // After the server has seen the cancel (it aborts the handler and drops its result): no response comes.
      if (typeof requestId === "string" || typeof requestId === "number") setImmediate(() => this.settle(requestId));
    }
  }

  /**
   * Shutdown, after the calls in progress had their time to be answered: answer each request still
   * unanswered with a JSON-RPC error, so that no client is left with a stream that ends without an answer.
   */
  async answerUnsettled(message: string): Promise<void> {
    for (const id of [...this.unsettled.keys()]) {
      const error = { code: -32000, message, data: { code: "REQUEST_CANCELLED" } };
      await this.send({ jsonrpc: "2.0", id, error }).catch(() => this.settle(id));
    }
  }

  /** The request is answered or cancelled: end its POST's stream once no request of that POST is left. */
  private settle(id: RequestId): void {
    const post = this.unsettled.get(id);
    if (!post) return;
    this.unsettled.delete(id);
    this.lastSettled = Date.now();
    post.delete(id);
    // A no-op when the SDK already ended the stream (every request of the POST answered).
    if (post.size === 0) this.closeSSEStream(id);
  }
}

export const isLoopback = (host: string): boolean => LOOPBACK_HOSTS.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host);

interface RefusalOptions {
  headers?: Record<string, string>;
  /** The refused request's id, where it had one the client waits on. */
  id?: string | number | null;
  /** JSON-RPC error code; -32000 (server error) unless the request itself is at fault. */
  code?: number;
  data?: Record<string, unknown>;
}

/** A JSON-RPC error as an HTTP answer (the shape the SDK's transport uses for its own refusals). */
function refuse(res: ServerResponse, status: number, message: string, { headers = {}, id = null, code = -32000, data }: RefusalOptions = {}): void {
  if (res.headersSent) return;
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code, message, ...(data && { data }) }, id }));
}

export class HttpFrontDoor {
  private readonly sessions = new Map<string, Session>();
  /** The last health check the worker was asked for (GET /health), and when. */
  private lastCheck?: { at: number; result: Promise<CallToolResult> };
  /** Sessions whose initialize is being answered: not in `sessions` yet, but already counted against the key. */
  private readonly opening = new Set<Session>();
  private readonly registry: PrincipalRegistry | null;
  private readonly http: NodeHttpServer;
  private readonly sweeper: NodeJS.Timeout;
  /** Set by close(): MCP requests are refused from then on. */
  private closing = false;

  constructor(
    private readonly core: IrisRagServer,
    private readonly config: HttpConfig,
  ) {
    this.registry = config.authFile ? new PrincipalRegistry(config.authFile) : null;
    if (!this.registry && !isLoopback(config.host)) {
      throw new ConfigError(
        `MCP_SERVER_HOST ${config.host} is not a loopback address: refusing to serve MCP there without authentication: set RAG_AUTH_FILE (see README, "HTTP service"), or listen on 127.0.0.1`,
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

  /** Listen; resolves with the bound address (port 0 picks a free one). A host or port it cannot use is a ConfigError naming it. */
  listen(): Promise<AddressInfo> {
    const { host, port } = this.config;
    return new Promise((resolve, reject) => {
      this.http.once("error", (error: NodeJS.ErrnoException) => {
        if (error.code !== undefined && HOST_ERRORS.has(error.code)) {
          reject(new ConfigError(`MCP_SERVER_HOST ${host}: cannot listen there (${error.message})`));
        } else if (error.code !== undefined && PORT_ERRORS.has(error.code)) {
          reject(new ConfigError(`MCP_SERVER_PORT ${port}: cannot listen on ${host}:${port} (${error.message})`));
        } else {
          reject(error);
        }
      });
      this.http.listen(this.config.port, this.config.host, () => resolve(this.http.address() as AddressInfo));
    });
  }

  get principals(): number {
    return this.registry?.size ?? 0;
  }

  /**
   * Shut down: refuse new requests, run `stopWork` (stopping the worker answers every call in progress,
   * REQUEST_CANCELLED), give those answers ANSWER_GRACE_MS to be written on their streams, then close the
   * sessions and the connections. Closing the streams first would leave each call in progress an empty 200.
   */
  async close(stopWork: () => Promise<void> = async () => undefined): Promise<void> {
    this.closing = true;
    clearInterval(this.sweeper);
    const closed = new Promise<void>((resolve) => this.http.close(() => resolve()));
    try {
      await stopWork();
    } catch (error) {
      console.error(`[iris-rag] stopping the worker: ${String(error)}`);
    }
    const deadline = Date.now() + ANSWER_GRACE_MS;
    while (this.inProgress() > 0 && Date.now() < deadline) await delay(20);
    const sessions = [...this.sessions.values(), ...this.opening];
    const left = this.inProgress();
    if (left > 0) {
      console.error(`[iris-rag] ${left} request(s) still unanswered ${ANSWER_GRACE_MS} ms after the worker stopped: answering them with an error`);
      await Promise.all(sessions.map((session) => session.transport.answerUnsettled(SHUTTING_DOWN)));
    }
    await Promise.all(sessions.map((session) => session.transport.close().catch(() => undefined)));
    // Let the responses just ended reach their sockets, then cut whatever is left (keep-alive connections).
    await delay(0);
    this.http.closeIdleConnections();
    await withinMs(closed, FLUSH_GRACE_MS);
    this.http.closeAllConnections();
    await closed;
  }

  /** Requests received on any session and not yet answered. */
  private inProgress(): number {
    let count = 0;
    for (const session of [...this.sessions.values(), ...this.opening]) count += session.transport.inProgress;
    return count;
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? "/", "http://host").pathname;
    if (path === "/health") {
      if (req.method !== "GET" && req.method !== "HEAD") return refuse(res, 405, "GET /health", { headers: { allow: "GET, HEAD" } });
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
          headers: { "www-authenticate": 'Bearer realm="iris-rag"' },
        });
      }
    }

    let body: unknown;
    if (req.method === "POST") {
      const read = await this.readBody(req, res);
      if (!read.ok) return;
      body = read.body;
      // The transport answers any message its schema refuses with "Parse error: Invalid JSON-RPC message",
      // and the SDK params its method's schema refuses with -32603 and a zod dump; say what is wrong
      // instead (a progressToken that is an object, resources/read without uri), as on stdio (frames.ts).
      const rejection = isObject(body) ? rejectMessage(body) : null;
      if (rejection) return refuse(res, 400, rejection.message, { id: rejection.id, code: rejection.code });
    }

    if (this.closing) {
      const id = isObject(body) && (typeof body.id === "string" || typeof body.id === "number") ? body.id : null;
      return refuse(res, 503, SHUTTING_DOWN, { id, headers: { connection: "close" } });
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
    // Read before isInitializeRequest narrows body to a type without it: the refusals below answer this id.
    const id = isObject(body) && (typeof body.id === "string" || typeof body.id === "number") ? body.id : null;
    if (req.method !== "POST" || !isObject(body) || !isInitializeRequest(body)) {
      return refuse(res, 400, "Bad Request: no valid session id (mcp-session-id); start with an initialize request");
    }
    if (principal) {
      const waitMs = this.core.limiter.take(principal);
      if (waitMs > 0) {
        return refuse(res, 429, `RATE_LIMIT_EXCEEDED: ${rateLimitMessage(principal, waitMs)}`, {
          id,
          headers: { "retry-after": String(Math.ceil(waitMs / 1000)) },
          data: { code: "RATE_LIMIT_EXCEEDED", retry_after_ms: waitMs },
        });
      }
    }
    // A session holds memory until it is closed or idles out, so a key holds only so many: past the cap its
    // least recently used idle session is closed (a client that leaks sessions, one per run, keeps working;
    // the closed session's client gets 404 and initializes again, as the specification says it should).
    // It is closed once the new session is initialized (makeRoom), not here: the transport may still refuse
    // this initialize (406, 415, 400), which must cost no other session. Each session being opened past the
    // cap is owed one idle session, so one opens only while the idle ones outnumber those owed (two
    // initializes at once never count on the same one). A busy session is never closed for a new one: its
    // call would be cancelled and its client left with no answer at all. When none is left the new session is
    // refused instead, 429 as for the key's rate limit: the key's own quota is spent, the server is not
    // unavailable (503 is shutdown's, and a probe's alarm).
    const max = this.config.maxSessionsPerKey;
    const held = this.sessionsOf(principal?.id ?? null);
    const idle = held.open.filter((session) => idleSince(session) !== null).length;
    if (held.open.length + held.opening + 1 - max > idle) {
      const holder = principal ? "this key" : "this server (no RAG_AUTH_FILE: all clients together)";
      const message =
        `All MCP_MAX_SESSIONS_PER_KEY (${max}) sessions of ${holder} are busy, with a call in progress or being opened: ` +
        "retry once a call ends, or close a session no longer used (DELETE /mcp with its mcp-session-id)";
      return refuse(res, 429, message, { id, data: { limit: "MCP_MAX_SESSIONS_PER_KEY", max_sessions: max } });
    }
    const session = this.openSession(principal);
    this.opening.add(session);
    try {
      await session.transport.handleRequest(request, res, body);
    } finally {
      this.opening.delete(session);
      // The transport refused the initialize (406, 415, 400: its own checks) and gave it no session id: no
      // client can reach this session, so nothing else would ever close it and its MCP server.
      if (session.transport.sessionId === undefined) void session.transport.close().catch(() => undefined);
    }
  }

  /** The open sessions of a key (null: no keys configured), and how many of its sessions are being opened. */
  private sessionsOf(principalId: string | null): { open: Session[]; opening: number } {
    const open = [...this.sessions.values()].filter((session) => session.principalId === principalId);
    const opening = [...this.opening].filter((session) => session.principalId === principalId).length;
    return { open, opening };
  }

  /**
   * A session was just initialized: while its key holds more than MCP_MAX_SESSIONS_PER_KEY open sessions,
   * close the key's least recently used idle one (never `opened` itself). None may be left idle when a
   * session admitted as owed one has since become busy: the key is then over its cap until the next
   * initialize, which is admitted only with an idle session for each session over it.
   */
  private makeRoom(opened: Session): void {
    const max = this.config.maxSessionsPerKey;
    const { open } = this.sessionsOf(opened.principalId);
    const excess = open.length - max;
    if (excess <= 0) return;
    const idle = open.flatMap((session) => {
      const since = session === opened ? null : idleSince(session);
      return since === null ? [] : [{ session, since }];
    });
    const holder = opened.principalId === null ? "the local clients" : `key ${opened.principalId}`;
    const closing = idle.sort((a, b) => a.since - b.since).slice(0, excess);
    console.error(
      `[iris-rag] ${holder} reached MCP_MAX_SESSIONS_PER_KEY=${max}: ` +
        (closing.length > 0 ? "closing its least recently used idle session" : `holds ${open.length} sessions, none idle to close`),
    );
    for (const { session } of closing) {
      if (session.transport.sessionId) this.sessions.delete(session.transport.sessionId);
      void session.transport.close().catch(() => undefined);
    }
  }

  private openSession(principal: Principal | null): Session {
    const server = this.core.newServer();
    const transport: SessionTransport = new SessionTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        this.opening.delete(session);
        this.sessions.set(id, session);
        this.makeRoom(session);
      },
    });
    const session: Session = { transport, server, principalId: principal?.id ?? null, lastSeen: Date.now() };
    transport.onclose = () => {
      this.opening.delete(session);
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
    const tooLarge = () => refuse(res, 413, `Request body larger than ${limit} bytes (MCP_MAX_BODY_BYTES)`, { headers: { connection: "close" } });
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
    // /health needs no key: probes within HEALTH_REUSE_MS of a check share it, so a burst (load balancers,
    // or anyone flooding it) costs the worker one check a second.
    const now = Date.now();
    if (!this.lastCheck || now - this.lastCheck.at >= HEALTH_REUSE_MS) {
      this.lastCheck = { at: now, result: this.core.tools.probeHealth() };
    }
    const result = await this.lastCheck.result;
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

  /** Close the sessions idle for MCP_SESSION_IDLE_MS; a busy one (a long ingest, say) is not idle. */
  private closeIdleSessions(): void {
    const cutoff = Date.now() - this.config.sessionIdleMs;
    for (const session of this.sessions.values()) {
      const since = idleSince(session);
      if (since !== null && since < cutoff) void session.transport.close().catch(() => undefined);
    }
  }
}
