import type { Principal } from "./auth.js";
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";

import { BridgeError, isErrorCode } from "./errors.js";
import { redactCredentials } from "./redaction.js";
import { isObject } from "./json.js";
import { withinMs } from "./time.js";

export interface BridgeOptions {
  python: string;
  /** The worker's working directory (the repository root). */
  cwd: string;
  env?: NodeJS.ProcessEnv;
  requestTimeoutMs: number;
  maxConcurrentRequests: number;
  maxQueuedRequests: number;
  /**
   * How long a timed-out or cancelled call keeps its slot while the worker stops it (it answers at its next
   * cancellation checkpoint); past this the slot is freed anyway, so a wedged call cannot hold it forever.
   */
  cancelGraceMs?: number;
  /** How long stop() waits for the worker to exit after `shutdown` before killing it. */
  shutdownGraceMs?: number;
}

/**
 * `work` calls take one of MAX_CONCURRENT_REQUESTS slots and wait in the queue for one; `control` calls
 * (cheap methods the worker serves on their own threads, and the bridge's own record_call and cancel)
 * are written at once, so a full queue never holds up a health check or the record of a refused call.
 */
export type Lane = "work" | "control";

/** The worker's cheap methods (iris_rag/worker/dispatch.py CONTROL, plus `cancel`). */
const CONTROL_METHODS = new Set(["describe", "health_check", "probe_health", "metrics", "list_collections", "record_call", "cancel", "shutdown"]);

export interface RequestOptions {
  timeoutMs?: number;
  /** Aborting it cancels the call: dropped if still queued, else the worker is told to stop it. */
  signal?: AbortSignal;
  /** The HTTP caller the worker serves this call for (its collection grants); absent: the local user. */
  principal?: Principal;
  /**
   * Each step the worker reports for this call (an ingest's batches and stages). A step also restarts the
   * call's time limit: a long call that keeps making progress is not cut off at timeoutMs.
   */
  onProgress?: (progress: Progress) => void;
}

/** One step of a running call, as the worker reported it (steps only grow). */
export interface Progress {
  progress: number;
  message: string;
}

interface Call {
  id: string;
  method: string;
  lane: Lane;
  /** The whole request line, serialized when the call is made (so a write can never throw). */
  line: string;
  resolve: (result: unknown) => void;
  reject: (error: BridgeError) => void;
  timer?: NodeJS.Timeout;
  timeoutMs: number;
  onProgress?: (progress: Progress) => void;
  /** The caller has its answer (result, error, time-out or cancel); the slot may still be held. */
  answered: boolean;
  onAbort?: () => void;
  signal?: AbortSignal;
}

interface WorkerResponse {
  id: string | number | null;
  success: boolean;
  result?: unknown;
  error?: { code?: unknown; message?: unknown; details?: unknown };
}

/**
 * The longest worker line the bridge reads (newline excluded): iris_rag/worker/protocol.py MAX_ANSWER_BYTES,
 * past which the worker answers RESULT_TOO_LARGE itself. A longer line is dropped, never held whole: one
 * past V8's longest string would throw out of the line reader and end the process.
 */
export const MAX_ANSWER_BYTES = 64 * 1024 * 1024;
/** How much of a dropped line is kept to read the id the worker writes first. */
const LINE_HEAD_BYTES = 512;
const STDERR_TAIL_CHARS = 2_000;
const DEFAULT_CANCEL_GRACE_MS = 30_000;

/** What a call gets when the server shuts down before it is answered (stopping the worker answers the rest). */
function shutdownError(call: Call, stage: "queued" | "running"): BridgeError {
  return new BridgeError("REQUEST_CANCELLED", `${call.method} was cancelled: the server is shutting down`, { stage });
}

/** The line of a worker's stderr that says why it failed: its last error or exception line, else its last line. */
export function causeFromStderr(stderr: string): string | undefined {
  const lines = stderr
    .split("\n")
    .map((line) => line.trim())
    .filter(Boolean);
  return [...lines].reverse().find((line) => /(Error|Exception)\b|^fatal\b/i.test(line)) ?? lines.at(-1);
}

/** The id at the start of a worker line (`{"id": ...`, written first), read without parsing the rest. */
function leadingId(head: string): string | undefined {
  const match = /^\s*\{\s*"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)/.exec(head);
  try {
    return match ? String(JSON.parse(match[1]!)) : undefined;
  } catch {
    return undefined; // a bad escape: as unreadable as no id
  }
}

/**
 * Splits a byte stream into UTF-8 lines of at most maxBytes (newline excluded). A longer line is not kept:
 * its first LINE_HEAD_BYTES and its length go to onOverlong, the rest is dropped up to its newline, and the
 * lines after it are read as usual.
 */
class LineSplitter {
  private parts: Buffer[] = [];
  private size = 0;
  /** The start of the over-long line being dropped, while it is. */
  private dropping?: Buffer;

  constructor(
    private readonly maxBytes: number,
    private readonly onLine: (line: string) => void,
    private readonly onOverlong: (head: string, bytes: number) => void,
  ) {}

  push(chunk: Buffer): void {
    let start = 0;
    while (start < chunk.length) {
      const newline = chunk.indexOf(0x0a, start);
      this.take(chunk.subarray(start, newline < 0 ? chunk.length : newline));
      if (newline < 0) return;
      this.endLine();
      start = newline + 1;
    }
  }

  /** The stream ended: a last line without a newline is still a line. */
  end(): void {
    if (this.size > 0 || this.dropping) this.endLine();
  }

  private take(piece: Buffer): void {
    this.size += piece.length;
    if (this.dropping) return;
    if (this.size > this.maxBytes) {
      this.dropping = Buffer.concat([...this.parts, piece], Math.min(LINE_HEAD_BYTES, this.size));
      this.parts = [];
    } else if (piece.length > 0) {
      this.parts.push(piece);
    }
  }

  private endLine(): void {
    const { dropping, parts, size } = this;
    this.parts = [];
    this.size = 0;
    this.dropping = undefined;
    if (dropping) this.onOverlong(dropping.toString("utf8"), size);
    else this.onLine(Buffer.concat(parts, size).toString("utf8"));
  }
}

/**
 * Owns the one long-lived Python worker (`python -m iris_rag.bridge`) and speaks its JSON-lines
 * protocol: requests carry string ids and answers may come back in any order.
 */
export class WorkerBridge {
  private worker?: ChildProcessWithoutNullStreams;
  /** Calls written to the worker and not yet answered by it (or released after the cancel grace). */
  private readonly sent = new Map<string, Call>();
  private readonly queue: Call[] = [];
  /** Work-lane calls holding a slot: sent, and not yet answered by the worker or released. */
  private busySlots = 0;
  private nextId = 0;
  private stopped = false;
  /** Whether the current worker has answered anything: if it exits before, it never started. */
  private workerReady = false;
  /** The id of stop()'s `shutdown` request, whose answer nobody waits for. */
  private shutdownId?: string;
  /** Last worker stderr, attached to WORKER_CRASHED so the caller sees why it died. */
  private stderrTail = "";

  constructor(private readonly options: BridgeOptions) {}

  /** The running worker's pid, if one is running (tests kill it to simulate a crash). */
  get workerPid(): number | undefined {
    return this.worker?.pid;
  }

  /** Work-lane slots held now: calls the worker may still be running (tests check they are released). */
  get slotsInUse(): number {
    return this.busySlots;
  }

  /** Send one request; resolves with the worker's `result`, rejects with a BridgeError. */
  request(method: string, params: object = {}, options: RequestOptions = {}): Promise<unknown> {
    const { timeoutMs = this.options.requestTimeoutMs, signal, principal, onProgress } = options;
    return new Promise((resolve, reject) => {
      if (this.stopped) {
        reject(new BridgeError("REQUEST_CANCELLED", `${method} was not sent: the server is shutting down`, { stage: "queued" }));
        return;
      }
      if (signal?.aborted) {
        reject(new BridgeError("REQUEST_CANCELLED", `${method} was cancelled before it was sent`));
        return;
      }
      const lane: Lane = CONTROL_METHODS.has(method) ? "control" : "work";
      const atCapacity = this.busySlots >= this.options.maxConcurrentRequests;
      if (lane === "work" && atCapacity && this.queue.length >= this.options.maxQueuedRequests) {
        reject(
          new BridgeError(
            "RATE_LIMIT_EXCEEDED",
            `${this.busySlots} requests running and ${this.queue.length} queued (MAX_QUEUED_REQUESTS=${this.options.maxQueuedRequests})`,
          ),
        );
        return;
      }
      const id = String(++this.nextId);
      let line: string;
      try {
        const caller = principal && { id: principal.id, scopes: principal.scopes, collections: principal.collections };
        line = `${JSON.stringify({ id, method, params, ...(caller && { principal: caller }), timestamp: new Date().toISOString() })}\n`;
      } catch (error) {
        // Too deep for the stack, a BigInt, a cycle: refuse this call, never throw out of a write.
        reject(new BridgeError("INVALID_PARAMETERS", `The arguments cannot be sent as JSON: ${(error as Error).message}`));
        return;
      }
      const call: Call = { id, method, lane, line, resolve, reject, answered: false, signal, timeoutMs, onProgress };
      // The clock runs from the call, not from dispatch: time spent queued counts against the limit.
      call.timer = setTimeout(() => this.expire(call), timeoutMs);
      if (signal) {
        call.onAbort = () => this.abort(call);
        signal.addEventListener("abort", call.onAbort, { once: true });
      }
      if (lane === "control") {
        const worker = this.worker ?? this.startWorker();
        if (worker) this.send(worker, call);
        else this.answer(call, new BridgeError("WORKER_UNAVAILABLE", `Cannot start ${this.options.python}`));
      } else {
        this.queue.push(call);
        this.pump();
      }
    });
  }

  /**
   * Ask the worker to shut down, kill it after the grace period, and answer everything pending: the worker
   * answers the calls it runs (REQUEST_CANCELLED at their next checkpoint, an ingest rolled back); the
   * queued calls, and any call still unanswered when the worker is gone, get REQUEST_CANCELLED here.
   * Resolves within the grace period and a second, even if the worker cannot be killed.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const call of this.queue.splice(0)) this.answer(call, shutdownError(call, "queued"));
    const worker = this.worker;
    if (worker && worker.exitCode === null && worker.signalCode === null) {
      const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
      this.shutdownId = String(++this.nextId);
      this.write(worker, `${JSON.stringify({ id: this.shutdownId, method: "shutdown", params: {} })}\n`);
      worker.stdin.end();
      const graceMs = this.options.shutdownGraceMs ?? 3_000;
      const grace = setTimeout(() => worker.kill("SIGKILL"), graceMs);
      await withinMs(exited, graceMs + 1_000);
      clearTimeout(grace);
    }
    // Its answers are all read before "close", which may come after "exit" (or never, if it cannot be killed).
    for (const call of [...this.sent.values()]) {
      if (call.answered) this.release(call);
      else this.finish(call, shutdownError(call, "running"));
    }
  }

  /** Move queued calls to the worker while there is a free slot, starting a worker if none runs. */
  private pump(): void {
    while (!this.stopped && this.queue.length > 0 && this.busySlots < this.options.maxConcurrentRequests) {
      const worker = this.worker ?? this.startWorker();
      if (!worker) return;
      this.send(worker, this.queue.shift()!);
    }
  }

  private send(worker: ChildProcessWithoutNullStreams, call: Call): void {
    this.sent.set(call.id, call);
    if (call.lane === "work") this.busySlots += 1;
    this.write(worker, call.line);
  }

  private startWorker(): ChildProcessWithoutNullStreams | undefined {
    const { python, cwd, env = process.env } = this.options;
    let worker: ChildProcessWithoutNullStreams;
    try {
      // The worker admits no more work than we send it: both sides hold the same bound.
      const workerEnv = { ...env, MAX_CONCURRENT_REQUESTS: String(this.options.maxConcurrentRequests) };
      worker = spawn(python, ["-m", "iris_rag.bridge"], { cwd, env: workerEnv, stdio: ["pipe", "pipe", "pipe"] });
    } catch (error) {
      this.failAll(new BridgeError("WORKER_UNAVAILABLE", `Cannot start ${python}: ${(error as Error).message}`));
      return undefined;
    }
    this.worker = worker;
    this.workerReady = false;
    this.stderrTail = "";
    if (worker.pid !== undefined) console.error(`[iris-rag] started worker pid ${worker.pid}: ${python} -m iris_rag.bridge`);

    worker.stderr.on("data", (chunk: Buffer) => {
      process.stderr.write(chunk);
      this.stderrTail = (this.stderrTail + chunk.toString("utf8")).slice(-STDERR_TAIL_CHARS);
    });
    // A write to a worker that just died raises EPIPE here; the exit handler does the cleanup.
    worker.stdin.on("error", (error) => console.error(`[iris-rag] worker stdin: ${error.message}`));
    const lines = new LineSplitter(MAX_ANSWER_BYTES, (line) => this.onLine(line), (head, bytes) => this.onOverlongLine(head, bytes));
    worker.stdout.on("data", (chunk: Buffer) => lines.push(chunk));
    worker.stdout.on("end", () => lines.end());

    worker.once("error", (error) => {
      // Spawn failure (e.g. ENOENT): no process ever ran, so nothing was "crashed".
      if (worker.pid === undefined) {
        this.onWorkerGone(worker, new BridgeError("WORKER_UNAVAILABLE", `Cannot start ${python}: ${error.message}`));
      } else {
        console.error(`[iris-rag] worker error: ${error.message}`);
      }
    });
    // "close", not "exit": it comes after the last stderr chunk, which holds the cause of a failed start.
    worker.once("close", (code, signal) => this.onWorkerGone(worker, this.exitError(python, code, signal)));
    return worker;
  }

  /** Why the worker went: stopped by us, never started (the cause from its stderr), or crashed mid-request. */
  private exitError(python: string, code: number | null, signal: NodeJS.Signals | null): BridgeError {
    const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
    if (this.stopped) return new BridgeError("REQUEST_CANCELLED", `The Python worker stopped (it ${how}): the server is shutting down`, { stage: "running" });
    // A worker that failed before it could redact (a traceback quoting a URL) must not hand a password on.
    const tail = redactCredentials(this.stderrTail.trim());
    const details = { exit_code: code, signal, ...(tail && { stderr_tail: tail }) };
    if (!this.workerReady) {
      // A worker that never answered cannot start (a missing package, a bad setting): a retry fails the same way.
      const cause = causeFromStderr(tail) ?? "no error output";
      // A worker that knows why it cannot start (DATABASE_CONNECTION_FAILED, say) says so as `fatal CODE: message`.
      const known = /^fatal ([A-Z_]+): (.*)$/.exec(cause);
      if (known && isErrorCode(known[1]!)) return new BridgeError(known[1]!, `The Python worker cannot start: ${known[2]!}`, { ...details, cause });
      return new BridgeError("WORKER_UNAVAILABLE", `The Python worker (${python}) ${how} during start-up: ${cause}`, { ...details, cause });
    }
    return new BridgeError("WORKER_CRASHED", `The Python worker ${how}`, details);
  }

  /** Fail what the dead worker held; queued calls go to a fresh worker started on demand. */
  private onWorkerGone(worker: ChildProcessWithoutNullStreams, error: BridgeError): void {
    if (this.worker !== worker) return;
    this.worker = undefined;
    const failed = this.sent.size > 0 ? `; ${this.sent.size} in-flight request(s) failed` : "";
    console.error(`[iris-rag] ${error.message}${failed}`);
    for (const call of [...this.sent.values()]) this.finish(call, error);
    if (error.code !== "WORKER_CRASHED") {
      // The worker cannot start: retrying the queue would spin; fail it too (the next call tries again).
      for (const call of this.queue.splice(0)) this.answer(call, error);
    }
    this.pump();
  }

  private onLine(line: string): void {
    if (!line.trim()) return;
    let response: WorkerResponse;
    try {
      const parsed: unknown = JSON.parse(line);
      if (isObject(parsed) && parsed.event === "ready") {
        this.workerReady = true;
        return;
      }
      if (isObject(parsed) && parsed.event === "progress") {
        this.onProgress(parsed);
        return;
      }
      if (!isObject(parsed) || typeof parsed.success !== "boolean") throw new Error("not a response object");
      response = parsed as unknown as WorkerResponse;
    } catch (error) {
      console.error(`[iris-rag] ignoring worker stdout line (${(error as Error).message}): ${line.slice(0, 500)}`);
      return;
    }
    this.workerReady = true;
    const id = response.id === null ? null : String(response.id);
    const call = id === null ? undefined : this.sent.get(id);
    if (!call) {
      if (id !== null && id === this.shutdownId) return;
      if (id === null) {
        // The worker could not read one of our lines, not even its id; the call fails at its time-out.
        console.error(`[iris-rag] the worker rejected an unreadable request: ${JSON.stringify(response.error)}`);
      } else {
        console.error(`[iris-rag] dropping an answer for request ${JSON.stringify(id)} (its slot was already released)`);
      }
      return;
    }
    if (response.success) {
      this.finish(call, undefined, response.result);
    } else {
      const { code, message, details } = response.error ?? {};
      this.finish(
        call,
        new BridgeError(
          typeof code === "string" ? code : "INTERNAL_ERROR",
          typeof message === "string" ? message : "The worker reported an error without a message",
          isObject(details) ? details : undefined,
        ),
      );
    }
  }

  /** A line past MAX_ANSWER_BYTES (the worker refuses to write one): fail its call, if its id can be read. */
  private onOverlongLine(head: string, bytes: number): void {
    const id = leadingId(head);
    const call = id === undefined ? undefined : this.sent.get(id);
    console.error(`[iris-rag] dropped a worker stdout line of ${bytes} bytes, over MAX_ANSWER_BYTES (${MAX_ANSWER_BYTES}), for request ${JSON.stringify(id ?? "unreadable")}`);
    if (!call) return;
    this.workerReady = true;
    const message = `The answer to ${call.method} is ${bytes} bytes, past the ${MAX_ANSWER_BYTES}-byte limit of one answer; ask for less`;
    this.finish(call, new BridgeError("RESULT_TOO_LARGE", message, { bytes, max_bytes: MAX_ANSWER_BYTES }));
  }

  /** A step of a running call: restart its time limit and pass the step on. */
  private onProgress(event: Record<string, unknown>): void {
    const call = this.sent.get(String(event.id));
    if (!call || call.answered || typeof event.progress !== "number") return;
    clearTimeout(call.timer);
    call.timer = setTimeout(() => this.expire(call), call.timeoutMs);
    call.onProgress?.({ progress: event.progress, message: typeof event.message === "string" ? event.message : "" });
  }

  private expire(call: Call): void {
    const { timeoutMs } = call;
    const queued = this.dropQueued(call);
    // Before its ready line the worker reads nothing: it is opening the store (an upgrade can take minutes).
    const starting = this.worker !== undefined && !this.workerReady;
    const why = starting ? ": the worker is still starting" : "";
    const error = new BridgeError("TIMEOUT_EXCEEDED", `${call.method} did not answer or report progress within ${timeoutMs} ms${why}`, {
      timeout_ms: timeoutMs,
      // Whether the worker ever got it: if not, only the front end can record the call.
      stage: queued ? "queued" : "running",
      ...(starting && { worker: "starting" }),
    });
    this.answer(call, error);
    if (!queued) this.drain(call, "timeout");
  }

  private abort(call: Call): void {
    if (call.answered) return;
    const queued = this.dropQueued(call);
    this.answer(call, new BridgeError("REQUEST_CANCELLED", `${call.method} was cancelled by the client`, { stage: queued ? "queued" : "running" }));
    if (!queued) this.drain(call, "client");
  }

  private dropQueued(call: Call): boolean {
    const index = this.queue.indexOf(call);
    if (index >= 0) this.queue.splice(index, 1);
    return index >= 0;
  }

  /**
   * The caller has its answer but the worker may still be running the call: tell the worker to stop it and
   * keep its slot until the worker answers (REQUEST_CANCELLED at its next checkpoint, or its late result),
   * or at most cancelGraceMs, so the worker never runs more calls than MAX_CONCURRENT_REQUESTS.
   */
  private drain(call: Call, reason: "timeout" | "client"): void {
    if (call.lane === "control" || !this.sent.has(call.id)) {
      this.release(call);
      return;
    }
    this.request("cancel", { request_id: call.id, reason }).catch((error: unknown) =>
      console.error(`[iris-rag] could not cancel request ${call.id}: ${String(error)}`),
    );
    const graceMs = this.options.cancelGraceMs ?? DEFAULT_CANCEL_GRACE_MS;
    call.timer = setTimeout(() => {
      console.error(`[iris-rag] request ${call.id} (${call.method}) did not stop within ${graceMs} ms of its cancel; freeing its slot`);
      this.release(call);
    }, graceMs);
  }

  /** The worker answered (or died): give the caller its answer if it has none yet, and free the slot. */
  private finish(call: Call, error?: BridgeError, result?: unknown): void {
    if (call.answered) console.error(`[iris-rag] request ${call.id} (${call.method}) stopped after its time-out or cancel`);
    this.answer(call, error, result);
    this.release(call);
  }

  /** Resolve or reject exactly once. */
  private answer(call: Call, error?: BridgeError, result?: unknown): void {
    if (call.answered) return;
    call.answered = true;
    clearTimeout(call.timer);
    if (call.onAbort) call.signal?.removeEventListener("abort", call.onAbort);
    if (error) call.reject(error);
    else call.resolve(result);
  }

  /** Forget the id (so a later answer is dropped) and free its slot, exactly once. */
  private release(call: Call): void {
    clearTimeout(call.timer);
    if (!this.sent.delete(call.id)) return;
    if (call.lane === "work") {
      this.busySlots -= 1;
      queueMicrotask(() => this.pump());
    }
  }

  private failAll(error: BridgeError): void {
    for (const call of [...this.sent.values()]) this.finish(call, error);
    for (const call of this.queue.splice(0)) this.answer(call, error);
  }

  private write(worker: ChildProcessWithoutNullStreams, line: string): void {
    if (worker.stdin.writable) worker.stdin.write(line);
  }
}
