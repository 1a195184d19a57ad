import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { createInterface } from "node:readline";

import { BridgeError } from "./errors.js";
import { isObject } from "./json.js";

export interface BridgeOptions {
  python: string;
  /** The worker's working directory (the repository root). */
  cwd: string;
  env?: NodeJS.ProcessEnv;
  requestTimeoutMs: number;
  maxConcurrentRequests: number;
  maxQueuedRequests: number;
  /** How long stop() waits for the worker to exit after `shutdown` before killing it. */
  shutdownGraceMs?: number;
}

interface Call {
  id: string;
  method: string;
  params: object;
  resolve: (result: unknown) => void;
  reject: (error: BridgeError) => void;
  timer: NodeJS.Timeout;
}

interface WorkerResponse {
  id: string | null;
  success: boolean;
  result?: unknown;
  error?: { code?: unknown; message?: unknown; details?: unknown };
}

const STDERR_TAIL_CHARS = 2_000;

/**
 * Owns the one long-lived Python worker (`python -m iris_rag.bridge`) and speaks its JSON-lines
 * protocol: requests carry string ids and answers may come back in any order.
 */
export class WorkerBridge {
  private worker?: ChildProcessWithoutNullStreams;
  private readonly inFlight = new Map<string, Call>();
  private readonly queue: Call[] = [];
  private nextId = 0;
  private stopped = false;
  /** The id of stop()'s `shutdown` request, whose answer nobody waits for. */
  private shutdownId?: string;
  /** Last worker stderr, attached to WORKER_CRASHED so the caller sees why it died. */
  private stderrTail = "";

  constructor(private readonly options: BridgeOptions) {}

  /** The running worker's pid, if one is running (tests kill it to simulate a crash). */
  get workerPid(): number | undefined {
    return this.worker?.pid;
  }

  /** Send one request; resolves with the worker's `result`, rejects with a BridgeError. */
  request(method: string, params: object = {}, timeoutMs = this.options.requestTimeoutMs): Promise<unknown> {
    return new Promise((resolve, reject) => {
      if (this.stopped) {
        reject(new BridgeError("WORKER_UNAVAILABLE", "The bridge is shut down"));
        return;
      }
      const atCapacity = this.inFlight.size >= this.options.maxConcurrentRequests;
      if (atCapacity && this.queue.length >= this.options.maxQueuedRequests) {
        reject(
          new BridgeError(
            "RATE_LIMIT_EXCEEDED",
            `${this.inFlight.size} requests running and ${this.queue.length} queued (MAX_QUEUED_REQUESTS=${this.options.maxQueuedRequests})`,
          ),
        );
        return;
      }
      const id = String(++this.nextId);
      // The clock runs from the call, not from dispatch: time spent queued counts against the limit.
      const timer = setTimeout(() => this.expire(id, method, timeoutMs), timeoutMs);
      this.queue.push({ id, method, params, resolve, reject, timer });
      this.pump();
    });
  }

  /** Ask the worker to shut down, kill it after the grace period, and fail everything pending. */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const call of this.queue.splice(0)) this.settle(call, new BridgeError("WORKER_UNAVAILABLE", "The bridge is shut down"));
    const worker = this.worker;
    if (!worker || worker.exitCode !== null || worker.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
    this.shutdownId = String(++this.nextId);
    this.write(worker, { id: this.shutdownId, method: "shutdown", params: {}, timestamp: new Date().toISOString() });
    worker.stdin.end();
    const grace = setTimeout(() => worker.kill("SIGKILL"), this.options.shutdownGraceMs ?? 3_000);
    await exited;
    clearTimeout(grace);
  }

  /** Move queued calls to the worker while there is room, starting a worker if none runs. */
  private pump(): void {
    while (!this.stopped && this.queue.length > 0 && this.inFlight.size < this.options.maxConcurrentRequests) {
      const worker = this.worker ?? this.startWorker();
      if (!worker) return;
      const call = this.queue.shift()!;
      this.inFlight.set(call.id, call);
      this.write(worker, { id: call.id, method: call.method, params: call.params, timestamp: new Date().toISOString() });
    }
  }

  private startWorker(): ChildProcessWithoutNullStreams | undefined {
    const { python, cwd, env = process.env } = this.options;
    let worker: ChildProcessWithoutNullStreams;
    try {
      worker = spawn(python, ["-m", "iris_rag.bridge"], { cwd, env, stdio: ["pipe", "pipe", "pipe"] });
    } catch (error) {
      this.failAll(new BridgeError("WORKER_UNAVAILABLE", `Cannot start ${python}: ${(error as Error).message}`));
      return undefined;
    }
    this.worker = worker;
    this.stderrTail = "";
    if (worker.pid !== undefined) console.error(`[iris-rag] started worker pid ${worker.pid}: ${python} -m iris_rag.bridge`);

    worker.stderr.on("data", (chunk: Buffer) => {
      process.stderr.write(chunk);
      this.stderrTail = (this.stderrTail + chunk.toString("utf8")).slice(-STDERR_TAIL_CHARS);
    });
    // A write to a worker that just died raises EPIPE here; the exit handler does the cleanup.
    worker.stdin.on("error", (error) => console.error(`[iris-rag] worker stdin: ${error.message}`));
    createInterface({ input: worker.stdout, crlfDelay: Infinity }).on("line", (line) => this.onLine(line));

    worker.once("error", (error) => {
      // Spawn failure (e.g. ENOENT): no process ever ran, so nothing was "crashed".
      if (worker.pid === undefined) {
        this.onWorkerGone(worker, new BridgeError("WORKER_UNAVAILABLE", `Cannot start ${python}: ${error.message}`));
      } else {
        console.error(`[iris-rag] worker error: ${error.message}`);
      }
    });
    worker.once("exit", (code, signal) => {
      const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
      const tail = this.stderrTail.trim();
      const error = this.stopped
        ? new BridgeError("WORKER_UNAVAILABLE", `The Python worker stopped (it ${how})`)
        : new BridgeError("WORKER_CRASHED", `The Python worker ${how}`, {
            exit_code: code,
            signal,
            ...(tail && { stderr_tail: tail }),
          });
      this.onWorkerGone(worker, error);
    });
    return worker;
  }

  /** Fail what the dead worker held; queued calls go to a fresh worker started on demand. */
  private onWorkerGone(worker: ChildProcessWithoutNullStreams, error: BridgeError): void {
    if (this.worker !== worker) return;
    this.worker = undefined;
    const failed = this.inFlight.size > 0 ? `; ${this.inFlight.size} in-flight request(s) failed` : "";
    console.error(`[iris-rag] ${error.message}${failed}`);
    for (const call of [...this.inFlight.values()]) this.settle(call, error);
    if (error.code === "WORKER_UNAVAILABLE") {
      // The executable itself is missing: retrying the queue would spin; fail it too.
      for (const call of this.queue.splice(0)) this.settle(call, error);
    }
    this.pump();
  }

  private onLine(line: string): void {
    if (!line.trim()) return;
    let response: WorkerResponse;
    try {
      const parsed: unknown = JSON.parse(line);
      if (!isObject(parsed) || typeof parsed.success !== "boolean") throw new Error("not a response object");
      response = parsed as unknown as WorkerResponse;
    } catch (error) {
      console.error(`[iris-rag] ignoring worker stdout line (${(error as Error).message}): ${line.slice(0, 500)}`);
      return;
    }
    const call = typeof response.id === "string" ? this.inFlight.get(response.id) : undefined;
    if (!call) {
      if (response.id === this.shutdownId) return;
      if (response.id === null) {
        // The worker could not read one of our lines, so it cannot say which request it was.
        console.error(`[iris-rag] the worker rejected an unreadable request: ${JSON.stringify(response.error)}`);
      } else {
        console.error(`[iris-rag] dropping a late answer for request ${JSON.stringify(response.id)} (timed out or failed)`);
      }
      return;
    }
    if (response.success) {
      this.settle(call, undefined, response.result);
    } else {
      const { code, message, details } = response.error ?? {};
      this.settle(
        call,
        new BridgeError(
          typeof code === "string" ? code : "INTERNAL_ERROR",
          typeof message === "string" ? message : "The worker reported an error without a message",
          isObject(details) ? details : undefined,
        ),
      );
    }
  }

  private expire(id: string, method: string, timeoutMs: number): void {
    const index = this.queue.findIndex((call) => call.id === id);
    const call = index >= 0 ? this.queue.splice(index, 1)[0] : this.inFlight.get(id);
    if (call) this.settle(call, new BridgeError("TIMEOUT_EXCEEDED", `${method} did not answer within ${timeoutMs} ms`, { timeout_ms: timeoutMs }));
  }

  /**
   * Resolve or reject exactly once, forget the id (so a late answer is dropped) and free its slot.
   * A timed-out call frees its slot too, even though the worker may still be busy with it: a hung
   * request must not block the queue forever.
   */
  private settle(call: Call, error?: BridgeError, result?: unknown): void {
    clearTimeout(call.timer);
    const wasInFlight = this.inFlight.delete(call.id);
    if (error) call.reject(error);
    else call.resolve(result);
    if (wasInFlight) queueMicrotask(() => this.pump());
  }

  private failAll(error: BridgeError): void {
    for (const call of [...this.inFlight.values(), ...this.queue.splice(0)]) this.settle(call, error);
  }

  private write(worker: ChildProcessWithoutNullStreams, message: object): void {
    if (worker.stdin.writable) worker.stdin.write(`${JSON.stringify(message)}\n`);
  }
}
