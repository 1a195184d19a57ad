/**
 * API keys for HTTP mode (RAG_AUTH_FILE): who a request is, what it may call, and how often.
 *
 * The file lists principals with the SHA-256 of their key, never the key:
 *   {"principals":[{"id":"alice","key_sha256":"<64 hex>","scopes":["read","write"],
 *                   "collections":["papers"],"requests_per_minute":120}]}
 * It is re-read when its modification time or size changes, so keys rotate without a restart; a file that
 * no longer parses keeps the last good table (and says why on stderr) rather than locking everyone out.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import type { IncomingHttpHeaders } from "node:http";

import { ConfigError } from "./config.js";
import { isObject } from "./json.js";

export const SCOPES = ["read", "write", "admin"] as const;
export type Scope = (typeof SCOPES)[number];

/** An authenticated caller, as the worker receives it with each request (iris_rag/access.py). */
export interface Principal {
  id: string;
  scopes: Scope[];
  /** Granted collection ids, or "*" for all of them. */
  collections: string[] | "*";
  /** Token-bucket rate: requests per minute (bursts up to this many); null for no limit. */
  requestsPerMinute: number | null;
}

interface Entry {
  principal: Principal;
  digest: Buffer;
}

const HEX_SHA256 = /^[0-9a-f]{64}$/;

/** Parse and check the file's content; throws with a message naming the first problem. */
export function parsePrincipals(text: string): Principal[] {
  return parseEntries(text).map((entry) => entry.principal);
}

/** rag_metrics' name for the local user's calls (iris_rag/monitor.py): no key may take it. */
const LOCAL_PRINCIPAL = "local";

function parseEntries(text: string): Entry[] {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new Error(`not JSON (${(error as Error).message})`);
  }
  if (!isObject(data) || !Array.isArray(data.principals)) throw new Error('expected {"principals": [...]}');
  const seen = new Set<string>();
  return data.principals.map((raw: unknown, index: number): Entry => {
    const where = `principals[${index}]`;
    if (!isObject(raw)) throw new Error(`${where} must be an object`);
    const { id, key_sha256: hash, scopes, collections, requests_per_minute: rate } = raw;
    if (typeof id !== "string" || !id.trim()) throw new Error(`${where}.id must be a non-empty string`);
    if (seen.has(id)) throw new Error(`${where}.id ${JSON.stringify(id)} appears twice`);
    if (id === LOCAL_PRINCIPAL) {
      throw new Error(`${where}.id "local" is reserved: rag_metrics reports the local user (stdio, the CLI) under it`);
    }
    seen.add(id);
    if (typeof hash !== "string" || !HEX_SHA256.test(hash.toLowerCase())) {
      throw new Error(`${where}.key_sha256 must be the 64 hex digits of the key's SHA-256 (sha256sum)`);
    }
    if (!Array.isArray(scopes) || !scopes.every((s): s is Scope => SCOPES.includes(s as Scope))) {
      throw new Error(`${where}.scopes must be a list drawn from ${SCOPES.join(", ")}`);
    }
    let granted: string[] | "*";
    if (collections === "*" || (Array.isArray(collections) && collections.includes("*"))) granted = "*";
    else if (Array.isArray(collections) && collections.every((c): c is string => typeof c === "string")) granted = collections;
    else throw new Error(`${where}.collections must be a list of collection ids or ["*"]`);
    if (rate !== undefined && rate !== null && !(typeof rate === "number" && Number.isFinite(rate) && rate > 0)) {
      throw new Error(`${where}.requests_per_minute must be a positive number`);
    }
    return {
      principal: { id, scopes, collections: granted, requestsPerMinute: typeof rate === "number" ? rate : null },
      digest: Buffer.from(hash.toLowerCase(), "hex"),
    };
  });
}

/** The key a request carries: `Authorization: Bearer <key>` or `X-API-Key: <key>`. */
export function presentedKey(headers: IncomingHttpHeaders): string | null {
  const authorization = headers.authorization;
  if (authorization) {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization);
    return match?.[1] ?? null;
  }
  const apiKey = headers["x-api-key"];
  const value = Array.isArray(apiKey) ? apiKey[0] : apiKey;
  return value?.trim() || null;
}

export const sha256 = (key: string): Buffer => createHash("sha256").update(key, "utf8").digest();

/** The principals of RAG_AUTH_FILE, re-read when the file changes. */
export class PrincipalRegistry {
  private entries: Entry[];
  private stamp: string;

  /** Reads the file now: a missing or invalid file stops the server at start (a ConfigError naming it). */
  constructor(private readonly path: string) {
    let text: string;
    try {
      this.stamp = this.fileStamp();
      text = readFileSync(path, "utf8");
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      throw new ConfigError(`RAG_AUTH_FILE ${path} could not be read: ${code ?? String(error)}`);
    }
    try {
      this.entries = parseEntries(text);
    } catch (error) {
      throw new ConfigError(`RAG_AUTH_FILE ${path} is invalid: ${(error as Error).message}`);
    }
  }

  get size(): number {
    return this.entries.length;
  }

  /** The principal whose key hashes to the presented key's hash, or null. */
  authenticate(key: string | null): Principal | null {
    this.reloadIfChanged();
    if (!key) return null;
    const digest = sha256(key);
    let found: Principal | null = null;
    // Compare with every entry, in constant time each, so timing tells nothing about which came close.
    for (const entry of this.entries) {
      if (timingSafeEqual(entry.digest, digest)) found = entry.principal;
    }
    return found;
  }

  private fileStamp(): string {
    const stat = statSync(this.path);
    return `${stat.mtimeMs}:${stat.size}:${stat.ino}`;
  }

  private reloadIfChanged(): void {
    let stamp: string;
    try {
      stamp = this.fileStamp();
    } catch (error) {
      console.error(`[iris-rag] RAG_AUTH_FILE ${this.path} cannot be read (${String(error)}); keeping the last keys`);
      return;
    }
    if (stamp === this.stamp) return;
    try {
      this.entries = parseEntries(readFileSync(this.path, "utf8"));
      this.stamp = stamp;
      console.error(`[iris-rag] RAG_AUTH_FILE reloaded: ${this.entries.length} principal(s)`);
    } catch (error) {
      // Half-written by an editor, say: try again on the next request, keep serving the last good keys.
      console.error(`[iris-rag] RAG_AUTH_FILE ${this.path} is invalid (${(error as Error).message}); keeping the last keys`);
    }
  }
}

/** The scope a tool needs: tools that change data (readOnlyHint false) need write, the rest read. */
export function requiredScope(annotations: { readOnlyHint?: boolean } | undefined): Scope {
  return annotations?.readOnlyHint === false ? "write" : "read";
}

export function hasScope(principal: Principal, scope: Scope): boolean {
  return principal.scopes.includes("admin") || principal.scopes.includes(scope);
}

/** What a caller past its requests_per_minute is told (tools/call, resources, initialize alike). */
export const rateLimitMessage = (principal: Principal, waitMs: number): string =>
  `More than ${principal.requestsPerMinute} requests per minute for this key (tools/call, resources/read, resources/list and initialize each count); retry in ${waitMs} ms`;

/**
 * One token bucket per principal: `rate` requests per minute, bursts up to `rate`. Shared by everything
 * that makes the worker work or holds memory (tools/call, resources/read and list, a new HTTP session).
 */
export class RateLimiter {
  private readonly buckets = new Map<string, { tokens: number; updated: number }>();

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** 0 when the call may go now (a token is taken), else the milliseconds until one is available. */
  take(principal: Principal): number {
    const rate = principal.requestsPerMinute;
    if (rate === null) return 0;
    const now = this.now();
    const bucket = this.buckets.get(principal.id) ?? { tokens: rate, updated: now };
    bucket.tokens = Math.min(rate, bucket.tokens + ((now - bucket.updated) * rate) / 60_000);
    bucket.updated = now;
    this.buckets.set(principal.id, bucket);
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      return 0;
    }
    return Math.ceil(((1 - bucket.tokens) * 60_000) / rate);
  }
}
