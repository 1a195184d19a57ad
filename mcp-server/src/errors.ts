/**
 * The error codes a caller can see, mirrored from iris_rag/errors.py, plus the ones only the
 * front end raises (RATE_LIMIT_EXCEEDED, WORKER_CRASHED, WORKER_UNAVAILABLE; in HTTP mode UNAUTHORIZED and
 * FORBIDDEN, which the worker also raises for collection grants).
 */
export const ERROR_HINTS = {
  INVALID_QUERY: "Pass a non-empty `query` string of at most 2,048 characters that is not only whitespace.",
  INVALID_PARAMETERS: "Fix the arguments named in the message so they match the tool's inputSchema (tools/list).",
  MISSING_REQUIRED_FIELD: "Add the required arguments named in the message (details.errors); tools/list marks them in each inputSchema's `required`.",
  PIPELINE_NOT_FOUND: "Call one of the tools listed by tools/list; the tool name is case-sensitive.",
  COLLECTION_NOT_FOUND: "Check the collection id with rag_list_collections, or create it with rag_ingest.",
  DOCUMENT_NOT_FOUND: "Use a document id returned in retrieved_documents[].id or rag_ingest's document_ids.",
  EMBEDDING_MISMATCH: "The collection was built with another embedding model; re-ingest it or start the server with that model.",
  RETRIEVAL_FAILED: "Retrieval failed inside the server; retry, and check rag_health_check if it persists.",
  GENERATION_FAILED: "The answer could not be generated; the retrieved documents may still be in structuredContent. Retry or set options.generate=false.",
  LLM_SERVICE_UNAVAILABLE: "The LLM server (LLM_BASE_URL) could not be reached; the retrieved documents may still be in structuredContent. Retry later, or set options.generate=false.",
  EMBEDDING_SERVICE_UNAVAILABLE: "No embeddings can be made: the local model failed to load, or the embedding API (EMBEDDING_BASE_URL) cannot be reached; check rag_health_check and the server logs.",
  DATABASE_CONNECTION_FAILED: "The store cannot be opened or written: the PostgreSQL server (RAG_POSTGRES_URL) is not reachable or the URL is malformed, the SQLite folder (RAG_DATA_DIR) cannot be written (a full disk, say) or its file is damaged, or a newer iris-rag wrote the store; fix what the message names, then retry.",
  INDEX_NOT_BUILT: "The collection predates this technique's index; run `iris-rag reindex --collection NAME` once, then retry.",
  SQL_REJECTED: "The SQL statement was refused (details.reason says why); send one read-only SELECT over the tables rag_table_schema lists.",
  RESULT_TOO_LARGE: "The answer was too large to send (details.max_bytes): ask for less (fewer rows, documents or results, shorter text) and call again.",
  REQUEST_CANCELLED: "The request was cancelled before it finished; nothing it would have written was kept. Send it again to run it.",
  TIMEOUT_EXCEEDED: "The request took too long; retry with a smaller top_k or fewer documents, or raise REQUEST_TIMEOUT_MS.",
  RATE_LIMIT_EXCEEDED: "Too many requests: retry after details.retry_after_ms (your key's rate limit) or once the running ones finish.",
  UNAUTHORIZED: "Send a valid API key as `Authorization: Bearer <key>` or `X-API-Key: <key>`.",
  FORBIDDEN: "Your API key lacks the scope this tool needs (read, write or admin) or may not write to that collection; ask for a key with it.",
  WORKER_CRASHED: "The Python worker stopped while handling the request; it restarts on the next call, so retry once.",
  WORKER_UNAVAILABLE: "The Python worker could not be started (the message gives its error): fix the setting it names (.env.template), or IRIS_RAG_PYTHON or the install it names (bash scripts/setup.sh).",
  MALFORMED_REQUEST: "The front end sent a request the worker could not read; this is a server bug, report it.",
  METHOD_NOT_FOUND: "The front end asked the worker for a method it does not have; front end and worker versions differ.",
  INTERNAL_ERROR: "Unexpected server error; retry, and report it with the message if it persists.",
} as const;

export type ErrorCode = keyof typeof ERROR_HINTS;

/** TIMEOUT_EXCEEDED's hint for a call that timed out before the worker was ready (details.worker "starting"). */
export const WORKER_STARTING_HINT =
  "The worker is still starting (a store upgrade or a model load; the server's log says which): retry shortly, or raise REQUEST_TIMEOUT_MS.";

export const isErrorCode = (code: string): code is ErrorCode => Object.hasOwn(ERROR_HINTS, code);

/** A failure with a code from the list above; built from the worker's error object or by the front end. */
export class BridgeError extends Error {
  override readonly name = "BridgeError";

  constructor(
    /** A code from ERROR_HINTS, or whatever the worker sent when it is newer than this list. */
    readonly code: string,
    message: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
  }

  get hint(): string {
    // Such a call waited on the worker's start, not on its own size: a smaller request would not help.
    if (this.code === "TIMEOUT_EXCEEDED" && this.details?.worker === "starting") return WORKER_STARTING_HINT;
    return isErrorCode(this.code) ? ERROR_HINTS[this.code] : ERROR_HINTS.INTERNAL_ERROR;
  }

  toJSON(): { code: string; message: string; details?: Record<string, unknown> } {
    return { code: this.code, message: this.message, ...(this.details && { details: this.details }) };
  }
}

/** Any thrown value as a BridgeError, so callers handle one type. */
export function asBridgeError(error: unknown): BridgeError {
  if (error instanceof BridgeError) return error;
  return new BridgeError("INTERNAL_ERROR", error instanceof Error ? error.message : String(error));
}
