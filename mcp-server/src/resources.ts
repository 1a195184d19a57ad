/**
 * Collections and documents as MCP resources, read through the worker's own tool methods (so a caller sees
 * exactly the collections its key may see):
 *   rag://collections                                   every collection, with counts and description
 *   rag://collection/{id}/stats                         one collection
 *   rag://collection/{id}/documents{?cursor,limit}      a page of its documents (next_uri reads the next)
 *   rag://collection/{id}/document/{document_id}        one document's text (text/plain)
 *   rag://podcast/{name}                                a podcast rag_generate_podcast made (audio/wav blob)
 * Ids are percent-encoded in URIs. After every write the server sends notifications/resources/list_changed.
 */
import type { ReadResourceResult, Resource, ResourceTemplate } from "@modelcontextprotocol/sdk/types.js";
import { McpError, ErrorCode } from "@modelcontextprotocol/sdk/types.js";
import { readFile } from "node:fs/promises";

import { RateLimiter, rateLimitMessage, type Principal } from "./auth.js";
import type { WorkerBridge } from "./bridge.js";
import { asBridgeError } from "./errors.js";
import { isObject, type JsonObject } from "./json.js";

/** JSON-RPC error for a resource that does not exist (MCP: -32002). */
const RESOURCE_NOT_FOUND = -32002;
/** A key past its requests_per_minute, or the worker's queue full: a server error, as http.ts's refusals. */
const RATE_LIMITED = -32000;
const NOT_FOUND_CODES = new Set(["COLLECTION_NOT_FOUND", "DOCUMENT_NOT_FOUND"]);
const PODCAST_PREFIX = "rag://podcast/";

const COLLECTIONS_URI = "rag://collections";
const enc = encodeURIComponent;

export const RESOURCE_TEMPLATES: ResourceTemplate[] = [
  {
    uriTemplate: "rag://collection/{collection_id}/stats",
    name: "collection-stats",
    title: "Collection statistics",
    description: "A collection's description, document and chunk counts, embedding model and dates.",
    mimeType: "application/json",
  },
  {
    uriTemplate: "rag://collection/{collection_id}/documents{?cursor,limit}",
    name: "collection-documents",
    title: "Collection documents",
    description: "A page of a collection's documents (ids, titles, sizes, dates); next_uri reads the next page.",
    mimeType: "application/json",
  },
  {
    uriTemplate: "rag://collection/{collection_id}/document/{document_id}",
    name: "document",
    title: "Document text",
    description: "One document's full text.",
    mimeType: "text/plain",
  },
  {
    uriTemplate: "rag://podcast/{name}",
    name: "podcast",
    title: "Podcast audio",
    description: "A podcast rag_generate_podcast made (its resource_uri), as WAV audio.",
    mimeType: "audio/wav",
  },
];

type Parsed =
  | { kind: "collections" }
  | { kind: "stats"; collection: string }
  | { kind: "documents"; collection: string; cursor?: string; limit?: number }
  | { kind: "document"; collection: string; document: string }
  | { kind: "podcast"; name: string };

/** What a rag:// URI names, or undefined for anything else; a bad query parameter throws invalid params. */
export function parseResourceUri(uri: string): Parsed | undefined {
  if (uri === COLLECTIONS_URI) return { kind: "collections" };
  if (uri.startsWith(PODCAST_PREFIX)) {
    const name = uri.slice(PODCAST_PREFIX.length);
    // The worker names podcasts [a-z0-9-]; anything else is no podcast (and never a path).
    return /^[a-z0-9][a-z0-9-]{0,127}$/.test(name) ? { kind: "podcast", name } : undefined;
  }
  const match = /^rag:\/\/collection\/([^/?#]+)\/(stats|documents|document\/([^/?#]+))(\?[^#]*)?$/.exec(uri);
  if (!match) return undefined;
  let collection: string;
  let document: string | undefined;
  try {
    collection = decodeURIComponent(match[1]!);
    document = match[3] === undefined ? undefined : decodeURIComponent(match[3]);
  } catch {
    return undefined; // a malformed percent-escape
  }
  const query = new URLSearchParams(match[4]?.slice(1) ?? "");
  if (match[2] === "stats" && !match[4]) return { kind: "stats", collection };
  if (match[2] === "documents") {
    const limit = query.get("limit");
    // Number() would make "abc" NaN (null in JSON) and "0x10" 16: only digits are a page size.
    if (limit !== null && !/^[0-9]+$/.test(limit)) {
      throw new McpError(
        ErrorCode.InvalidParams,
        `the query parameter limit of ${uri.slice(0, 300)} must be a positive integer (documents per page), not ${JSON.stringify(limit.slice(0, 100))}`,
        { uri },
      );
    }
    return { kind: "documents", collection, ...(query.has("cursor") && { cursor: query.get("cursor")! }), ...(limit !== null && { limit: Number(limit) }) };
  }
  if (document !== undefined && !match[4]) return { kind: "document", collection, document };
  return undefined;
}

export class ResourceRouter {
  constructor(
    private readonly bridge: WorkerBridge,
    /** The per-key token buckets tools/call spends from (server.ts): a read costs the worker as much. */
    private readonly limiter: RateLimiter = new RateLimiter(),
  ) {}

  /** rag://collections, and each collection's stats and first page of documents. */
  async list(principal?: Principal): Promise<Resource[]> {
    this.spend(principal);
    const { collections } = (await this.call("list_collections", {}, principal)) as { collections: JsonObject[] };
    const resources: Resource[] = [
      { uri: COLLECTIONS_URI, name: "collections", title: "Collections", description: "Every collection, with counts and descriptions.", mimeType: "application/json" },
    ];
    for (const collection of collections) {
      const id = String(collection.id);
      const about = typeof collection.description === "string" && collection.description ? `: ${collection.description}` : "";
      resources.push(
        { uri: `rag://collection/${enc(id)}/stats`, name: `${id}-stats`, title: `${id} statistics`, description: `Collection ${id}${about}`, mimeType: "application/json" },
        { uri: `rag://collection/${enc(id)}/documents`, name: `${id}-documents`, title: `${id} documents`, description: `The documents of ${id}, a page at a time.`, mimeType: "application/json" },
      );
    }
    return resources;
  }

  async read(uri: string, principal?: Principal): Promise<ReadResourceResult> {
    this.spend(principal, uri);
    const target = parseResourceUri(uri);
    if (!target) {
      throw new McpError(ErrorCode.InvalidParams, `Unknown resource URI ${JSON.stringify(uri.slice(0, 300))}; see resources/list and resources/templates/list`);
    }
    const json = (value: unknown): ReadResourceResult => ({ contents: [{ uri, mimeType: "application/json", text: JSON.stringify(value) }] });
    switch (target.kind) {
      case "collections":
        return json(await this.call("list_collections", {}, principal));
      case "stats": {
        const { collections } = (await this.call("list_collections", {}, principal)) as { collections: JsonObject[] };
        const found = collections.find((collection) => collection.id === target.collection);
        if (!found) throw new McpError(RESOURCE_NOT_FOUND, `No collection ${JSON.stringify(target.collection)}`, { uri });
        return json(found);
      }
      case "documents": {
        const params = { collection_id: target.collection, ...(target.cursor !== undefined && { cursor: target.cursor }), ...(target.limit !== undefined && { limit: target.limit }) };
        const page = (await this.call("list_documents", params, principal, uri)) as JsonObject;
        const next = typeof page.next_cursor === "string" ? `rag://collection/${enc(target.collection)}/documents?cursor=${enc(page.next_cursor)}${target.limit !== undefined ? `&limit=${target.limit}` : ""}` : null;
        return json({ ...page, next_uri: next });
      }
      case "document": {
        const document = (await this.call("get_document", { collection_id: target.collection, document_id: target.document }, principal, uri)) as JsonObject;
        return { contents: [{ uri, mimeType: "text/plain", text: typeof document.content === "string" ? document.content : "" }] };
      }
      case "podcast": {
        // The worker checks the name and the caller's access and says where the file is; the audio itself
        // is read here, so megabytes of it never cross the worker's JSON-lines pipe.
        const file = (await this.call("podcast_file", { name: target.name }, principal, uri)) as JsonObject;
        const audio = await readFile(String(file.path));
        return { contents: [{ uri, mimeType: typeof file.mime_type === "string" ? file.mime_type : "audio/wav", blob: audio.toString("base64") }] };
      }
    }
  }

  /** One token from the HTTP caller's bucket (as tools/call takes one), or a rate-limit error. */
  private spend(principal?: Principal, uri?: string): void {
    if (!principal) return;
    const waitMs = this.limiter.take(principal);
    if (waitMs > 0) {
      const data = { code: "RATE_LIMIT_EXCEEDED", retry_after_ms: waitMs, ...(uri !== undefined && { uri }) };
      throw new McpError(RATE_LIMITED, `RATE_LIMIT_EXCEEDED: ${rateLimitMessage(principal, waitMs)}`, data);
    }
  }

  /** A worker method; its errors as JSON-RPC errors (not found: -32002, bad arguments: invalid params). */
  private async call(method: string, params: JsonObject, principal?: Principal, uri?: string): Promise<unknown> {
    try {
      const result = await this.bridge.request(method, params, principal && { principal });
      if (!isObject(result)) throw new McpError(ErrorCode.InternalError, `${method} returned no object`);
      return result;
    } catch (error) {
      if (error instanceof McpError) throw error;
      const failure = asBridgeError(error);
      const data = { code: failure.code, ...(uri !== undefined && { uri }) };
      if (NOT_FOUND_CODES.has(failure.code)) throw new McpError(RESOURCE_NOT_FOUND, failure.message, data);
      if (failure.code === "INVALID_PARAMETERS") throw new McpError(ErrorCode.InvalidParams, failure.message, data);
      if (failure.code === "RATE_LIMIT_EXCEEDED") throw new McpError(RATE_LIMITED, `${failure.code}: ${failure.message}`, data);
      throw new McpError(ErrorCode.InternalError, `${failure.code}: ${failure.message}`, data);
    }
  }
}
