import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { hasScope, parsePrincipals, presentedKey, PrincipalRegistry, RateLimiter, requiredScope, type Principal } from "../auth.js";

const hash = (key: string) => createHash("sha256").update(key).digest("hex");
const file = (principals: unknown[]) => JSON.stringify({ principals });
const alice = { id: "alice", key_sha256: hash("k1"), scopes: ["read"], collections: ["papers"] };

describe("RAG_AUTH_FILE principals", () => {
  it("parses principals, '*' grants and rates", () => {
    const [parsed, star] = parsePrincipals(
      file([{ ...alice, requests_per_minute: 60 }, { id: "ops", key_sha256: hash("k2"), scopes: ["admin"], collections: ["*"] }]),
    );
    assert.deepEqual(parsed, { id: "alice", scopes: ["read"], collections: ["papers"], requestsPerMinute: 60 });
    assert.equal(star?.collections, "*");
  });

  for (const [label, bad, message] of [
    ["a plain key instead of its hash", { ...alice, key_sha256: "k1" }, /64 hex digits/],
    ["an unknown scope", { ...alice, scopes: ["root"] }, /scopes/],
    ["collections that are not a list", { ...alice, collections: "papers" }, /collections/],
    ["a zero rate", { ...alice, requests_per_minute: 0 }, /requests_per_minute/],
    // rag_metrics' by_principal reports the local user (stdio, the CLI) as "local": the key's calls would merge.
    ["the id 'local'", { ...alice, id: "local" }, /principals\[0\]\.id "local" is reserved/],
  ] as const) {
    it(`refuses ${label}`, () => assert.throws(() => parsePrincipals(file([bad])), message));
  }

  it("refuses a repeated id", () => assert.throws(() => parsePrincipals(file([alice, alice])), /twice/));

  it("authenticates by key, and reloads the file when it changes, keeping the last good keys on a bad edit", () => {
    const path = join(mkdtempSync(join(tmpdir(), "iris-rag-auth-")), "principals.json");
    writeFileSync(path, file([alice]));
    const registry = new PrincipalRegistry(path);
    assert.equal(registry.authenticate("k1")?.id, "alice");
    assert.equal(registry.authenticate("k2"), null);
    assert.equal(registry.authenticate(null), null);

    writeFileSync(path, file([{ ...alice, key_sha256: hash("k2") }]));
    utimesSync(path, new Date(), new Date(Date.now() + 5_000));
    assert.equal(registry.authenticate("k1"), null, "the rotated key no longer works");
    assert.equal(registry.authenticate("k2")?.id, "alice");

    writeFileSync(path, "{ half-written");
    utimesSync(path, new Date(), new Date(Date.now() + 10_000));
    assert.equal(registry.authenticate("k2")?.id, "alice", "a broken file keeps the last good keys");
  });
});

describe("keys, scopes and rates", () => {
  it("reads Bearer and X-API-Key headers", () => {
    assert.equal(presentedKey({ authorization: "Bearer abc" }), "abc");
    assert.equal(presentedKey({ authorization: "bearer  abc " }), "abc");
    assert.equal(presentedKey({ authorization: "Basic abc" }), null);
    assert.equal(presentedKey({ "x-api-key": "xyz" }), "xyz");
    assert.equal(presentedKey({}), null);
  });

  it("needs write for tools that change data, read for the rest; admin has every scope", () => {
    assert.equal(requiredScope({ readOnlyHint: false }), "write");
    assert.equal(requiredScope({ readOnlyHint: true }), "read");
    const reader: Principal = { id: "r", scopes: ["read"], collections: "*", requestsPerMinute: null };
    assert.equal(hasScope(reader, "write"), false);
    assert.equal(hasScope({ ...reader, scopes: ["admin"] }, "write"), true);
  });

  it("token bucket: a burst up to the rate, then a wait that refills", () => {
    let now = 0;
    const limiter = new RateLimiter(() => now);
    const principal: Principal = { id: "p", scopes: ["read"], collections: "*", requestsPerMinute: 2 };
    assert.equal(limiter.take(principal), 0);
    assert.equal(limiter.take(principal), 0);
    const wait = limiter.take(principal);
    assert.ok(wait > 0 && wait <= 30_000, `waits ${wait} ms`);
    now += wait;
    assert.equal(limiter.take(principal), 0, "after the wait one call goes");
    assert.equal(limiter.take({ ...principal, id: "q" }), 0, "buckets are per principal");
    assert.equal(limiter.take({ ...principal, requestsPerMinute: null }), 0);
  });
});
