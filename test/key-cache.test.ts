import { randomBytes } from "node:crypto";
import net, { type AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createKeyCache } from "../src/auth.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance, testRedisUrl, type TestInstance } from "./helpers/instances.ts";
import { until } from "./helpers/until.ts";

const CREATE_KEY = `mutation { createApiKey(role: READER) { key id } }`;
const REVOKE = `mutation($id: ID!) { revokeApiKey(id: $id) { id } }`;
const VIEWER = `{ viewer { role } }`;

async function viewerCode(url: string, key: string): Promise<string> {
  const response = await fetch(`${url}/graphql`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ query: VIEWER }),
  });
  const body = (await response.json()) as { data?: { viewer: { role: string } }; errors?: { extensions?: { code?: string } }[] };
  return body.errors?.[0]?.extensions?.code ?? body.data!.viewer.role;
}

/** A loopback port nothing listens on: a Redis that is down. */
async function deadPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** The database as a key cache sees it, counting the lookups it makes (one statement each). */
function countingLookups(engram: TestEngram) {
  const lookups = { count: 0 };
  const raw = engram.services.db;
  const db = new Proxy(raw, {
    get: (target, property) =>
      property === "$queryRaw"
        ? (...args: Parameters<typeof raw.$queryRaw>) => (lookups.count++, target.$queryRaw(...args))
        : Reflect.get(target, property),
  });
  return { db, lookups };
}

describe("the API-key cache", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline" } });
  });
  afterAll(() => engram?.stop());

  it("answers from memory for at most its TTL: a revocation it never hears of fails once that runs out", async () => {
    let clock = 0;
    const { db, lookups } = countingLookups(engram);
    const cache = createKeyCache(db, engram.services.pubsub, { ttlMs: 5_000, now: () => clock });
    const { data } = await engram.gql(CREATE_KEY);
    const header = `Bearer ${data.createApiKey.key}`;
    try {
      expect(await cache.authenticate(header)).toMatchObject({ apiKeyId: data.createApiKey.id, role: "READER" });
      expect(await cache.authenticate(header)).toMatchObject({ role: "READER" });
      expect(lookups.count).toBe(1);
      // Revoked behind the cache's back (as by an instance whose announcement is lost).
      await engram.services.db.apiKey.update({ where: { id: data.createApiKey.id }, data: { revokedAt: new Date() } });
      clock = 999;
      expect(await cache.authenticate(header)).not.toBeNull();
      // A TTL over 1 s is cut to 1 s.
      clock = 1_000;
      expect(await cache.authenticate(header)).toBeNull();
      // Unknown keys are remembered too, and malformed ones never reach the database.
      lookups.count = 0;
      const madeUp = `Bearer egm_${"A".repeat(43)}`;
      expect(await cache.authenticate(madeUp)).toBeNull();
      expect(await cache.authenticate(madeUp)).toBeNull();
      expect(await cache.authenticate("Basic abc")).toBeNull();
      expect(await cache.authenticate("Bearer egm_made-up")).toBeNull();
      expect(await cache.authenticate(`Bearer egm_${"A".repeat(44)}`)).toBeNull();
      expect(lookups.count).toBe(1);
    } finally {
      await cache.close();
    }
  });

  it("counts the TTL from when the lookup began, and keeps a flood of unknown keys from pushing a live key out", async () => {
    const { db, lookups } = countingLookups(engram);
    let clock = 0;
    const cache = createKeyCache(db, engram.services.pubsub, { ttlMs: 1_000, maxEntries: 3, now: () => clock });
    const header = `Bearer ${engram.tenant.reader}`;
    // The answer comes while the clock moves on: it is kept until 1 s after the lookup began.
    const first = cache.authenticate(header);
    clock = 600;
    expect(await first).not.toBeNull();
    clock = 999;
    expect(await cache.authenticate(header)).not.toBeNull();
    expect(lookups.count).toBe(1);
    clock = 1_000;
    expect(await cache.authenticate(header)).not.toBeNull();
    expect(lookups.count).toBe(2);
    // Ten made-up keys, more than the cache holds: the live key is still answered from memory.
    for (let i = 0; i < 10; i++) expect(await cache.authenticate(`Bearer egm_${String(i).padStart(43, "x")}`)).toBeNull();
    lookups.count = 0;
    expect(await cache.authenticate(header)).not.toBeNull();
    expect(lookups.count).toBe(0);
    await cache.close();
  });

  it("with a TTL of 0 asks the database on every request", async () => {
    const { db, lookups } = countingLookups(engram);
    const cache = createKeyCache(db, engram.services.pubsub, { ttlMs: 0 });
    const header = `Bearer ${engram.tenant.reader}`;
    await Promise.all([cache.authenticate(header), cache.authenticate(header)]);
    await cache.authenticate(header);
    expect(lookups.count).toBe(3);
    await cache.close();
  });

  it("drops a key revoked on this instance at once", async () => {
    const cache = createKeyCache(engram.services.db, engram.services.pubsub, { ttlMs: 1_000, now: () => 0 });
    const { data } = await engram.gql(CREATE_KEY);
    const header = `Bearer ${data.createApiKey.key}`;
    expect(await cache.authenticate(header)).not.toBeNull();
    await engram.services.db.apiKey.update({ where: { id: data.createApiKey.id }, data: { revokedAt: new Date() } });
    // Its clock is frozen: only the revocation drops the key.
    expect(await cache.authenticate(header)).not.toBeNull();
    cache.revoked(data.createApiKey.id);
    expect(await cache.authenticate(header)).toBeNull();
    await cache.close();
  });

  it("a revoked key's next request fails, though the key was cached a moment before", async () => {
    const { data } = await engram.gql(CREATE_KEY);
    expect((await engram.gql(VIEWER, {}, data.createApiKey.key)).data.viewer.role).toBe("READER");
    expect((await engram.gql(REVOKE, { id: data.createApiKey.id })).errors).toBeUndefined();
    const after = await engram.gql(VIEWER, {}, data.createApiKey.key);
    expect(after.errors?.[0].extensions?.code).toBe("UNAUTHENTICATED");
  });
});

describe("when the key lookup fails (the store is down)", () => {
  let engram: TestEngram;
  let url: string;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline" } });
    url = await engram.listen();
  });
  afterAll(() => engram?.stop());

  // A key of the right shape that no cache holds, so each request asks the store.
  const madeUpKey = () => `egm_${randomBytes(32).toString("base64url")}`;

  /** Runs `work` while every key lookup fails, and returns the rejections nothing handled meanwhile. */
  async function withLookupsFailing(work: () => Promise<void>): Promise<unknown[]> {
    const db = engram.services.db as unknown as { $queryRaw: unknown };
    const original = db.$queryRaw;
    const unhandled: unknown[] = [];
    const onRejection = (reason: unknown) => unhandled.push(reason);
    process.on("unhandledRejection", onRejection);
    db.$queryRaw = () => Promise.reject(new Error("connect ECONNREFUSED 10.9.8.7:5432 (db-secret-host)"));
    try {
      await work();
      await new Promise((resolve) => setTimeout(resolve, 200));
    } finally {
      db.$queryRaw = original;
      process.off("unhandledRejection", onRejection);
    }
    return unhandled;
  }

  it("/graphql and the REST paths answer a JSON INTERNAL_SERVER_ERROR, with no stack and no driver message", async () => {
    const unhandled = await withLookupsFailing(async () => {
      for (const [method, path] of [["POST", "/graphql"], ["GET", "/memory"], ["GET", "/memory/openapi.json"]]) {
        const response = await fetch(`${url}${path}`, {
          method,
          headers: { "content-type": "application/json", authorization: `Bearer ${madeUpKey()}` },
          body: method === "POST" ? JSON.stringify({ query: VIEWER }) : undefined,
        });
        expect(response.status, path).toBe(500);
        expect(response.headers.get("content-type")).toMatch(/application\/json/);
        const text = await response.text();
        expect(JSON.parse(text).errors[0].extensions.code).toBe("INTERNAL_SERVER_ERROR");
        expect(text).not.toMatch(/ {4}at |ECONNREFUSED|db-secret-host/);
      }
    });
    expect(unhandled).toEqual([]);
  });

  it("/mcp answers a JSON-RPC error with HTTP 500 at once, and the server lives on", async () => {
    const unhandled = await withLookupsFailing(async () => {
      const response = await fetch(`${url}/mcp`, {
        method: "POST",
        headers: { "content-type": "application/json", accept: "application/json, text/event-stream", authorization: `Bearer ${madeUpKey()}` },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" }),
        signal: AbortSignal.timeout(3_000),
      });
      expect(response.status).toBe(500);
      const text = await response.text();
      expect(JSON.parse(text)).toMatchObject({ jsonrpc: "2.0", error: { code: -32603, message: expect.stringMatching(/^INTERNAL_SERVER_ERROR: /) } });
      expect(text).not.toMatch(/ECONNREFUSED|db-secret-host/);
    });
    expect(unhandled).toEqual([]);
    expect(await viewerCode(url, engram.tenant.reader)).toBe("READER");
  });
});

describe("revocation across instances", () => {
  let first: TestEngram;
  let firstUrl: string;
  const others: TestInstance[] = [];
  beforeAll(async () => {
    const REDIS_URL = await testRedisUrl();
    first = await startTestEngram({ env: { REDIS_URL, ENGRAM_EMBEDDINGS: "offline" } });
    firstUrl = await first.listen();
  });
  afterAll(async () => {
    for (const other of others) await other.stop();
    await first?.stop();
  });

  it("through Redis: the other instance drops the key when it hears of the revocation", async () => {
    // The second instance's clock is frozen: its cache would keep the key for ever, so only the
    // announcement over Redis can make the key fail there.
    const second = await startSecondInstance(first, { REDIS_URL: await testRedisUrl(), ENGRAM_EMBEDDINGS: "offline" }, { clock: () => 0 });
    others.push(second);
    await until("the second instance on redis", async () => second.services.pubsub.mode() === "redis");
    const { data } = await first.gql(CREATE_KEY);
    expect(await viewerCode(second.url, data.createApiKey.key)).toBe("READER");
    expect(await viewerCode(firstUrl, data.createApiKey.key)).toBe("READER");

    expect((await first.gql(REVOKE, { id: data.createApiKey.id })).errors).toBeUndefined();
    expect(await viewerCode(firstUrl, data.createApiKey.key)).toBe("UNAUTHENTICATED");
    await until("the second instance to refuse the key", async () => (await viewerCode(second.url, data.createApiKey.key)) === "UNAUTHENTICATED");
  });

  it("with Redis down: the other instance's cache runs out (TTL at most 1 s) and the key fails there too", async () => {
    const REDIS_URL = `redis://127.0.0.1:${await deadPort()}`;
    const second = await startSecondInstance(first, { REDIS_URL, ENGRAM_EMBEDDINGS: "offline" });
    others.push(second);
    expect(second.services.pubsub.mode()).toBe("degraded");
    const { data } = await first.gql(CREATE_KEY);
    expect(await viewerCode(second.url, data.createApiKey.key)).toBe("READER");
    expect((await first.gql(REVOKE, { id: data.createApiKey.id })).errors).toBeUndefined();
    await until("the second instance to refuse the key", async () => (await viewerCode(second.url, data.createApiKey.key)) === "UNAUTHENTICATED");
  });
});
