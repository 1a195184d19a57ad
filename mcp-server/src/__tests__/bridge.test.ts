import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it, type TestContext } from "node:test";

import { MAX_ANSWER_BYTES, WorkerBridge, type BridgeOptions } from "../bridge.js";
import { BridgeError } from "../errors.js";
import { loadToolSpecs, servedToolSpecs } from "../schemas.js";
import { config, freshDataDir } from "./helpers.js";

/** A bridge to the real worker (python -m iris_rag.bridge) over an empty data directory, stopped after the test. */
function realBridge(t: TestContext, overrides: Partial<BridgeOptions> = {}): WorkerBridge {
  const bridge = new WorkerBridge({
    python: config.python,
    cwd: config.repoRoot,
    env: { ...process.env, RAG_DATA_DIR: freshDataDir() },
    requestTimeoutMs: 120_000,
    maxConcurrentRequests: 8,
    maxQueuedRequests: 100,
    ...overrides,
  });
  t.after(() => bridge.stop());
  return bridge;
}

/** Documents whose ingestion takes a while: the embedding model loads and every chunk is embedded. */
const slowIngest = (count = 15) => ({
  collection_id: "slow",
  documents: Array.from({ length: count }, (_, i) => ({
    id: `doc-${i}`,
    content: `Document ${i}. `.concat("Retrieval-augmented generation grounds answers in retrieved text. ".repeat(60)),
  })),
});

/**
 * Alike documents: one encode, then 4 rows each to write. The worker writes them before its last cancel
 * check, so a call cancelled or timed out once it reports "committing" runs on for the whole write (a
 * second on this machine for a thousand), whatever the machine's speed.
 */
const alikeIngest = (count: number) => {
  const content = "Retrieval-augmented generation grounds answers in retrieved text. ".repeat(60);
  return { collection_id: "alike", documents: Array.from({ length: count }, (_, i) => ({ id: `doc-${i}`, content })) };
};
const basicOnly = () => ({ ...process.env, RAG_DATA_DIR: freshDataDir(), RAG_TECHNIQUES: "basic" });

const isToolTable = (result: unknown) =>
  Array.isArray((result as { tools?: unknown }).tools) && (result as { tools: unknown[] }).tools.length >= 6;

async function rejection(promise: Promise<unknown>): Promise<BridgeError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof BridgeError, `expected a BridgeError, got ${String(error)}`);
    return error;
  }
  assert.fail("expected the request to fail");
}

describe("WorkerBridge against the real worker", { timeout: 240_000 }, () => {
  it("answers describe with the tool table", async (t) => {
    const result = await realBridge(t).request("describe", {});
    assert.ok(isToolTable(result));
  });

  it("correlates answers that come back out of order", async (t) => {
    const bridge = realBridge(t);
    const order: string[] = [];
    const slow = bridge.request("ingest", slowIngest()).then(() => order.push("ingest"));
    const fast = bridge.request("describe", {}).then((result) => {
      assert.ok(isToolTable(result));
      order.push("describe");
    });
    await Promise.all([slow, fast]);
    assert.deepEqual(order, ["describe", "ingest"]);
  });

  it("rejects with TIMEOUT_EXCEEDED, drops the late answer and keeps working", async (t) => {
    const bridge = realBridge(t);
    // 1 ms is shorter than the worker's start-up, so describe's answer arrives after the timeout.
    const error = await rejection(bridge.request("describe", {}, { timeoutMs: 1 }));
    assert.equal(error.code, "TIMEOUT_EXCEEDED");
    assert.match(error.message, /1 ms/);
    assert.ok(isToolTable(await bridge.request("describe", {})));
  });

  it("fails in-flight requests with WORKER_CRASHED when the worker dies, then restarts it", async (t) => {
    // A short request limit makes a missed crash fail as TIMEOUT_EXCEEDED instead of hanging the test.
    const bridge = realBridge(t, { requestTimeoutMs: 8_000 });
    await bridge.request("describe", {});
    const firstPid = bridge.workerPid;
    assert.ok(firstPid);
    const inFlight = rejection(bridge.request("ingest", slowIngest()));
    await new Promise((resolve) => setTimeout(resolve, 200));
    const killedAt = Date.now();
    process.kill(firstPid, "SIGKILL");
    const error = await inFlight;
    assert.equal(error.code, "WORKER_CRASHED");
    assert.match(error.message, /SIGKILL/);
    assert.ok(Date.now() - killedAt < 2_000, "the in-flight request must fail promptly");
    assert.ok(isToolTable(await bridge.request("describe", {})));
    assert.ok(bridge.workerPid && bridge.workerPid !== firstPid, "a new worker runs");
  });

  it("fails at once with RATE_LIMIT_EXCEEDED when the queue is full, and never queues control calls", async (t) => {
    const bridge = realBridge(t, { maxConcurrentRequests: 1, maxQueuedRequests: 2 });
    const missing = { collection_id: "none", document_id: "x" };
    const accepted = [1, 2, 3].map(() => rejection(bridge.request("get_document", missing)));
    const error = await rejection(bridge.request("get_document", missing));
    assert.equal(error.code, "RATE_LIMIT_EXCEEDED");
    // The record of that refusal (and health, metrics) go on the control lane: never refused, never queued.
    await bridge.request("record_call", { tool: "rag_get_document", duration_ms: 1, success: false, error_code: "RATE_LIMIT_EXCEEDED" });
    for (const refused of await Promise.all(accepted)) assert.equal(refused.code, "COLLECTION_NOT_FOUND");
  });

  it("refuses arguments it cannot serialize with INVALID_PARAMETERS instead of throwing", async (t) => {
    // The reproduction: a call that must wait for a slot, with metadata nested 5,000 deep.
    const bridge = realBridge(t, { maxConcurrentRequests: 1 });
    let metadata: Record<string, unknown> = {};
    for (let i = 0; i < 5_000; i++) metadata = { m: metadata };
    const running = bridge.request("get_document", { collection_id: "none", document_id: "x" });
    const error = await rejection(bridge.request("ingest", { collection_id: "c", documents: [{ content: "x", metadata }] }));
    assert.equal(error.code, "INVALID_PARAMETERS");
    await rejection(running);
    assert.ok(isToolTable(await bridge.request("describe", {})));
  });

  it("cancels a queued call at once and a running one in the worker, which records it once", async (t) => {
    // A grace longer than the ingest: the slot is held until the worker answers, however slow the machine.
    const bridge = realBridge(t, { maxConcurrentRequests: 1, cancelGraceMs: 200_000 });
    const running = new AbortController();
    const slow = rejection(bridge.request("ingest", slowIngest(10), { signal: running.signal }));
    const waiting = new AbortController();
    const queued = rejection(bridge.request("ingest", { ...slowIngest(1), collection_id: "never" }, { signal: waiting.signal }));
    waiting.abort();
    const dropped = await queued;
    assert.equal(dropped.code, "REQUEST_CANCELLED");
    assert.equal(dropped.details?.stage, "queued");
    await new Promise((resolve) => setTimeout(resolve, 300));
    running.abort();
    assert.equal((await slow).code, "REQUEST_CANCELLED");
    // The slot stays taken until the worker stops the ingest (or the grace bound passes).
    assert.equal(bridge.slotsInUse, 1);
    while (bridge.slotsInUse > 0) await new Promise((resolve) => setTimeout(resolve, 100));
    const metrics = (await bridge.request("metrics", { time_range: "1h" })) as { by_tool: Record<string, { request_count: number; error_codes: object }> };
    assert.equal(metrics.by_tool.rag_ingest?.request_count, 1);
    assert.deepEqual(metrics.by_tool.rag_ingest?.error_codes, { REQUEST_CANCELLED: 1 });
    const collections = (await bridge.request("list_collections", {})) as { collections: Array<{ id: string }> };
    assert.ok(!collections.collections.some((c) => c.id === "never"), "the queued call never ran");
  });

  it("holds a timed-out call's slot until the worker stops it, and records it once as TIMEOUT_EXCEEDED", async (t) => {
    const bridge = realBridge(t, { maxConcurrentRequests: 1, cancelGraceMs: 200_000, env: basicOnly() });
    // Progress resets the time limit: it runs out 300 ms into the write, which goes on for a second.
    const error = await rejection(bridge.request("ingest", alikeIngest(1000), { timeoutMs: 300 }));
    assert.equal(error.code, "TIMEOUT_EXCEEDED");
    assert.equal(error.details?.stage, "running");
    assert.equal(bridge.slotsInUse, 1, "the worker still runs it");
    // Released when the worker answers the ingest (at its next checkpoint, or when it is done).
    while (bridge.slotsInUse > 0) await new Promise((resolve) => setTimeout(resolve, 100));
    const metrics = (await bridge.request("metrics", { time_range: "1h" })) as { by_tool: Record<string, { request_count: number; success_count: number; error_codes: object }> };
    assert.equal(metrics.by_tool.rag_ingest?.request_count, 1);
    assert.equal(metrics.by_tool.rag_ingest?.success_count, 0);
    assert.deepEqual(metrics.by_tool.rag_ingest?.error_codes, { TIMEOUT_EXCEEDED: 1 });
  });

  it("frees a slot after the cancel grace, and the worker still refuses more than MAX_CONCURRENT_REQUESTS", async (t) => {
    const bridge = realBridge(t, { maxConcurrentRequests: 1, cancelGraceMs: 200, env: basicOnly() });
    const cancel = new AbortController();
    const onProgress = ({ message }: { message: string }) => {
      if (message.startsWith("committing")) cancel.abort();
    };
    const error = await rejection(bridge.request("ingest", alikeIngest(1000), { signal: cancel.signal, onProgress }));
    assert.equal(error.code, "REQUEST_CANCELLED");
    while (bridge.slotsInUse > 0) await new Promise((resolve) => setTimeout(resolve, 20));
    // The bridge let the slot go after the grace; the worker, still writing, refuses a second call.
    const refused = await rejection(bridge.request("ingest", { ...slowIngest(1), collection_id: "second" }));
    assert.equal(refused.code, "RATE_LIMIT_EXCEEDED");
    assert.match(refused.message, /MAX_CONCURRENT_REQUESTS/);
  });

  it("lists offline exactly the tools the worker's describe serves", async (t) => {
    const schemaDir = join(config.repoRoot, "iris_rag", "schemas");
    for (const techniques of [null, ["basic"], ["basic", "sqlrag"]]) {
      const bridge = realBridge(t, { env: { ...process.env, RAG_DATA_DIR: freshDataDir(), RAG_TECHNIQUES: techniques?.join(",") ?? "all" } });
      const described = (await bridge.request("describe", {})) as { tools: unknown[] };
      assert.deepEqual(servedToolSpecs(loadToolSpecs(schemaDir), techniques), described.tools);
      await bridge.stop();
    }
    const basicOnly = servedToolSpecs(loadToolSpecs(schemaDir), ["basic"]).map((spec) => spec.name);
    for (const name of ["rag_graph_explore", "rag_ingest_table", "rag_table_schema", "rag_graphrag"]) assert.ok(!basicOnly.includes(name), name);
  });
});

describe("WorkerBridge protocol edge cases (scripted worker)", () => {
  /** A stand-in iris_rag.bridge in its own directory: `python -m iris_rag.bridge` resolves it from cwd. */
  function scriptedBridge(t: TestContext): WorkerBridge {
    const root = freshDataDir();
    mkdirSync(join(root, "iris_rag"));
    writeFileSync(join(root, "iris_rag", "__init__.py"), "");
    writeFileSync(
      join(root, "iris_rag", "bridge.py"),
      `import json, sys
print("not json at start-up", flush=True)
print(json.dumps({"id": None, "event": "ready"}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    method, rid = request["method"], request["id"]
    if method == "die":
        print("fatal: told to die", file=sys.stderr, flush=True)
        sys.exit(3)
    if method == "fail":
        print(json.dumps({"id": rid, "success": False, "error": {"code": "COLLECTION_NOT_FOUND", "message": "no such", "details": {"collection_id": "x"}}}), flush=True)
        continue
    if method in ("huge", "huge_no_id"):
        # One line past the bridge's cap, then an ordinary line in the same write.
        head = '{"id": %s, "success": true, "result": {"blob": "' % json.dumps(rid) if method == "huge" else '["'
        sys.stdout.write(head + "x" * request["params"]["bytes"] + '"}}\\n' + json.dumps({"id": None, "event": "ready"}) + "\\n")
        sys.stdout.flush()
        continue
    print("{half a line", flush=True)
    print(json.dumps({"id": None, "success": False, "error": {"code": "MALFORMED_REQUEST", "message": "unreadable"}}), flush=True)
    print(json.dumps({"id": rid, "success": True, "result": {"method": method, "params": request["params"]}}), flush=True)
`,
    );
    const bridge = new WorkerBridge({ python: config.python, cwd: root, requestTimeoutMs: 20_000, maxConcurrentRequests: 4, maxQueuedRequests: 4 });
    t.after(() => bridge.stop());
    return bridge;
  }

  it("ignores lines that are not JSON responses and still resolves by id", async (t) => {
    const result = await scriptedBridge(t).request("echo", { a: 1 });
    assert.deepEqual(result, { method: "echo", params: { a: 1 } });
  });

  it("fails an answer line past MAX_ANSWER_BYTES with RESULT_TOO_LARGE and keeps the worker and its other calls", async (t) => {
    const bridge = scriptedBridge(t);
    assert.deepEqual(await bridge.request("echo", {}), { method: "echo", params: {} });
    const pid = bridge.workerPid;
    const [error, beside] = await Promise.all([
      rejection(bridge.request("huge", { bytes: MAX_ANSWER_BYTES + 1_000_000 })),
      bridge.request("echo", { beside: true }),
    ]);
    assert.equal(error.code, "RESULT_TOO_LARGE");
    assert.match(error.message, /huge/);
    assert.equal(error.details?.max_bytes, MAX_ANSWER_BYTES);
    assert.deepEqual(beside, { method: "echo", params: { beside: true } });
    // A line whose id cannot be read is dropped (its call would fail at its time-out); the stream stays in step.
    void bridge.request("huge_no_id", { bytes: MAX_ANSWER_BYTES + 10 }, { timeoutMs: 60_000 }).catch(() => undefined);
    assert.deepEqual(await bridge.request("echo", { after: true }), { method: "echo", params: { after: true } });
    assert.equal(bridge.workerPid, pid, "the same worker still serves");
  });

  it("rejects with the worker's error code, message and details", async (t) => {
    const error = await rejection(scriptedBridge(t).request("fail", {}));
    assert.deepEqual(error.toJSON(), { code: "COLLECTION_NOT_FOUND", message: "no such", details: { collection_id: "x" } });
  });

  it("names the exit code and keeps the stderr tail when the worker exits", async (t) => {
    const bridge = scriptedBridge(t);
    const error = await rejection(bridge.request("die", {}));
    assert.equal(error.code, "WORKER_CRASHED");
    assert.match(error.message, /code 3/);
    assert.match(String(error.details?.stderr_tail), /told to die/);
    assert.deepEqual(await bridge.request("echo", {}), { method: "echo", params: {} });
  });

  it("fails with WORKER_UNAVAILABLE and the cause when the worker exits before it is ready", async () => {
    const root = freshDataDir();
    mkdirSync(join(root, "iris_rag"));
    writeFileSync(join(root, "iris_rag", "__init__.py"), "");
    writeFileSync(join(root, "iris_rag", "bridge.py"), "import numpy_that_is_not_installed\n");
    const bridge = new WorkerBridge({ python: config.python, cwd: root, requestTimeoutMs: 20_000, maxConcurrentRequests: 1, maxQueuedRequests: 4 });
    const [first, queued] = await Promise.all([rejection(bridge.request("execute", {})), rejection(bridge.request("execute", {}))]);
    for (const error of [first, queued]) {
      assert.equal(error.code, "WORKER_UNAVAILABLE");
      assert.match(error.message, /during start-up: ModuleNotFoundError: No module named 'numpy_that_is_not_installed'/);
      assert.doesNotMatch(error.hint, /retry/i);
    }
    await bridge.stop();
  });

  it("fails every call with the worker's own code when it knows why it cannot start (an unreachable database)", async (t) => {
    const url = "postgresql://rag:pg-secret-pw@127.0.0.1:1/rag"; // nothing listens on port 1
    const bridge = realBridge(t, { env: { ...process.env, RAG_DATA_DIR: freshDataDir(), RAG_STORE: "postgres", RAG_POSTGRES_URL: url } });
    const [first, queued] = await Promise.all([rejection(bridge.request("list_collections", {})), rejection(bridge.request("execute", {}))]);
    for (const error of [first, queued]) {
      assert.equal(error.code, "DATABASE_CONNECTION_FAILED");
      assert.match(error.message, /cannot start: the PostgreSQL server cannot be reached/);
      assert.doesNotMatch(JSON.stringify(error.toJSON()), /pg-secret-pw/);
    }
  });

  it("names the bad setting when the worker cannot start, with no secret and no install hint", async (t) => {
    const env = { ...process.env, RAG_DATA_DIR: freshDataDir(), CHUNK_SIZE: "500", CHUNK_OVERLAP: "600", LLM_API_KEY: "sk-tail-of-a-secret-9876" };
    const error = await rejection(realBridge(t, { env }).request("list_collections", {}));
    assert.equal(error.code, "WORKER_UNAVAILABLE");
    assert.match(error.message, /cannot start: invalid configuration: CHUNK_OVERLAP \(600\) must be smaller than CHUNK_SIZE \(500\)/);
    assert.match(error.hint, /setting/);
    assert.doesNotMatch(JSON.stringify(error.toJSON()), /secret-9876/);
  });

  it("masks credentials in the stderr tail of a worker that fails to start", async () => {
    const root = freshDataDir();
    mkdirSync(join(root, "iris_rag"));
    writeFileSync(join(root, "iris_rag", "__init__.py"), "");
    writeFileSync(
      join(root, "iris_rag", "bridge.py"),
      'raise ValueError("cannot parse postgresql://rag:TopSecretPw42@[::1/rag or host=db password=hunter2hunter2 or https://x/v1?api_key=sk-abcdef or postgres//rag:Typo5ecret42@db/rag or postgresql://rag:pa?ss#Hash5ecret@db/rag")\n',
    );
    const bridge = new WorkerBridge({ python: config.python, cwd: root, requestTimeoutMs: 20_000, maxConcurrentRequests: 1, maxQueuedRequests: 1 });
    const error = await rejection(bridge.request("execute", {}));
    const said = JSON.stringify(error.toJSON());
    for (const secret of ["TopSecretPw42", "hunter2hunter2", "sk-abcdef", "Typo5ecret42", "Hash5ecret"]) assert.doesNotMatch(said, new RegExp(secret));
    assert.match(said, /postgresql:\/\/\*\*\*@/);
    await bridge.stop();
  });

  it("names the worker's start, not the call's size, in a time-out before the worker is ready", async (t) => {
    // The upgrade tester's store: its first open rebuilt keyword tables for minutes before the ready line,
    // and every call timed out with "retry with a smaller top_k".
    const root = freshDataDir();
    mkdirSync(join(root, "iris_rag"));
    writeFileSync(join(root, "iris_rag", "__init__.py"), "");
    writeFileSync(
      join(root, "iris_rag", "bridge.py"),
      `import json, sys, time
time.sleep(2)  # a store upgrade
print(json.dumps({"id": None, "event": "ready"}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request["method"] != "hang":
        print(json.dumps({"id": request["id"], "success": True, "result": request["method"]}), flush=True)
`,
    );
    const bridge = new WorkerBridge({ python: config.python, cwd: root, requestTimeoutMs: 20_000, maxConcurrentRequests: 1, maxQueuedRequests: 4 });
    t.after(() => bridge.stop());
    const [sent, queued, control] = await Promise.all([
      rejection(bridge.request("execute", {}, { timeoutMs: 500 })),
      rejection(bridge.request("execute", {}, { timeoutMs: 500 })),
      rejection(bridge.request("describe", {}, { timeoutMs: 500 })),
    ]);
    for (const error of [sent, queued, control]) {
      assert.equal(error.code, "TIMEOUT_EXCEEDED");
      assert.match(error.message, /the worker is still starting/);
      assert.match(error.hint, /still starting \(a store upgrade or a model load/);
      assert.doesNotMatch(error.hint, /top_k/);
    }
    assert.deepEqual([sent.details?.stage, queued.details?.stage], ["running", "queued"]);
    // Once it is ready, a time-out is the call's own again.
    assert.equal(await bridge.request("describe", {}), "describe");
    const late = await rejection(bridge.request("hang", {}, { timeoutMs: 300 }));
    assert.match(late.hint, /smaller top_k/);
    assert.doesNotMatch(late.message, /starting/);
  });

  it("fails with WORKER_UNAVAILABLE when the Python executable does not exist", async () => {
    const bridge = new WorkerBridge({ python: "/nonexistent/python3", cwd: config.repoRoot, requestTimeoutMs: 5_000, maxConcurrentRequests: 1, maxQueuedRequests: 1 });
    const [first, second] = await Promise.all([rejection(bridge.request("describe", {})), rejection(bridge.request("describe", {}))]);
    assert.equal(first.code, "WORKER_UNAVAILABLE");
    assert.equal(second.code, "WORKER_UNAVAILABLE");
    await bridge.stop();
  });
});
