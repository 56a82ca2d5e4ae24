import net, { type AddressInfo } from "node:net";
import { createClient, type Client } from "graphql-ws";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance, testRedisUrl, type TestInstance } from "./helpers/instances.ts";
import { sseSubscribe } from "./helpers/sse.ts";
import { until } from "./helpers/until.ts";
import { collect, settle } from "./helpers/ws.ts";

const CREATE_KEY = `mutation { createApiKey(role: READER) { key id } }`;
const REVOKE = `mutation($id: ID!) { revokeApiKey(id: $id) { id revokedAt } }`;
const APPEND = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`;
const FEED = `subscription { eventAppended { id body } }`;

/** A graphql-ws client that records how its socket closed. */
function client(url: string, key: string) {
  const closes: { code: number; reason: string }[] = [];
  const ws: Client = createClient({
    url: `${url.replace(/^http/, "ws")}/graphql`,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${key}` },
    retryAttempts: 0,
    lazy: true,
    on: { closed: (event) => void closes.push({ code: (event as CloseEvent).code, reason: (event as CloseEvent).reason }) },
  });
  return { ws, closes };
}

async function append(engram: TestEngram, body: string) {
  const { errors } = await engram.gql(APPEND, {
    input: { scope: "PROJECT", scopeRef: "ws", kind: "note", body, source: "test", sourceRef: body },
  }, engram.tenant.writer);
  expect(errors).toBeUndefined();
}

async function revokeAndExpectSilence(engram: TestEngram, url: string) {
  const { data } = await engram.gql(CREATE_KEY);
  const reader = client(url, data.createApiKey.key);
  const feed = collect(reader.ws, FEED);
  await settle(500);
  await append(engram, "before revocation");
  await feed.next(1);

  const revoked = await engram.gql(REVOKE, { id: data.createApiKey.id });
  expect(revoked.errors).toBeUndefined();
  const closed = await until("the revoked key's socket to close", async () => reader.closes[0]);
  expect(closed).toMatchObject({ code: 4401, reason: "API key revoked" });

  for (let i = 0; i < 3; i++) await append(engram, `after revocation ${i}`);
  await settle(500);
  expect(feed.received.map((r) => r.data?.eventAppended.body)).toEqual(["before revocation"]);
  await reader.ws.dispose();
}

describe("WebSocket connections and API keys", () => {
  let engram: TestEngram;
  let url: string;
  beforeAll(async () => {
    engram = await startTestEngram({
      env: { ENGRAM_EMBEDDINGS: "offline", ENGRAM_WS_MAX_CONNECTIONS_PER_KEY: "2", ENGRAM_WS_MAX_SUBSCRIPTIONS: "3" },
    });
    url = await engram.listen();
  });
  afterAll(() => engram?.stop());

  it("closes a revoked key's sockets, and no event reaches them afterwards", async () => {
    await revokeAndExpectSilence(engram, url);
  });

  it("bounds connections per key, with a close code and reason", async () => {
    const clients = [0, 1, 2].map(() => client(url, engram.tenant.reader));
    const feeds = clients.map((c) => collect(c.ws, FEED));
    // Whichever connects third is refused; the other two stay open.
    const refused = await until("a third connection to be refused", async () => clients.find((c) => c.closes.length));
    expect(refused!.closes[0]).toMatchObject({ code: 4429 });
    expect(refused!.closes[0].reason).toMatch(/Too many connections/);
    expect(clients.filter((c) => c.closes.length)).toHaveLength(1);
    feeds.forEach((f) => f.dispose());
    await Promise.all(clients.map((c) => c.ws.dispose()));
  });

  it("bounds subscriptions per connection with a typed error", async () => {
    const reader = client(url, engram.tenant.writer);
    const feeds = [0, 1, 2, 3].map(() => collect(reader.ws, FEED));
    await until("the fourth subscription to be refused", async () => feeds[3].failure);
    expect(JSON.stringify(feeds[3].failure)).toContain("TOO_MANY_SUBSCRIPTIONS");
    expect(feeds.slice(0, 3).map((f) => f.failure)).toEqual([undefined, undefined, undefined]);
    feeds.forEach((f) => f.dispose());
    await reader.ws.dispose();
  });
});

describe("subscriptions over HTTP (SSE) and API keys", () => {
  let engram: TestEngram;
  let url: string;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline", ENGRAM_WS_MAX_CONNECTIONS_PER_KEY: "2" } });
    url = await engram.listen();
  });
  afterAll(() => engram?.stop());

  it("ends a revoked key's stream with UNAUTHENTICATED, and no event reaches it afterwards", async () => {
    const { data } = await engram.gql(CREATE_KEY);
    const stream = await sseSubscribe(url, data.createApiKey.key, FEED);
    await settle(500);
    await append(engram, "sse before revocation");
    expect((await stream.next(1)).data?.eventAppended.body).toBe("sse before revocation");

    expect((await engram.gql(REVOKE, { id: data.createApiKey.id })).errors).toBeUndefined();
    const refused = await stream.next(2);
    expect(refused.errors?.[0]).toMatchObject({ message: "API key revoked", extensions: { code: "UNAUTHENTICATED" } });
    await until("the stream to end", async () => stream.ended);
    for (let i = 0; i < 3; i++) await append(engram, `sse after revocation ${i}`);
    await settle(500);
    expect(stream.received).toHaveLength(2);
    stream.close();
  });

  it("counts each stream against the key's connections, and frees its place when it ends", async () => {
    const streams = [await sseSubscribe(url, engram.tenant.reader, FEED), await sseSubscribe(url, engram.tenant.reader, FEED)];
    await settle(300);
    const third = await sseSubscribe(url, engram.tenant.reader, FEED);
    expect((await third.next(1)).errors?.[0]).toMatchObject({ extensions: { code: "TOO_MANY_CONNECTIONS" } });
    streams[0].close();
    const again = await until("a place for another stream", async () => {
      const next = await sseSubscribe(url, engram.tenant.reader, FEED);
      await settle(200);
      if (next.received.length === 0) return next;
      next.close();
      return null;
    });
    await append(engram, "to the streams that stay");
    expect((await again.next(1)).data?.eventAppended.body).toBe("to the streams that stay");
    [streams[1], third, again].forEach((s) => s.close());
  });
});

describe("revocation across instances (Redis)", () => {
  let first: TestEngram;
  let second: TestInstance;
  beforeAll(async () => {
    const REDIS_URL = await testRedisUrl();
    first = await startTestEngram({ env: { REDIS_URL, ENGRAM_EMBEDDINGS: "offline" } });
    await first.listen();
    second = await startSecondInstance(first, { REDIS_URL, ENGRAM_EMBEDDINGS: "offline" });
  });
  afterAll(async () => {
    await second?.stop();
    await first?.stop();
  });

  it("a key revoked on one instance loses its sockets on the other", async () => {
    await revokeAndExpectSilence(first, second.url);
  });
});

describe("revocation while Redis is down", () => {
  let first: TestEngram;
  let firstUrl: string;
  let second: TestInstance;
  beforeAll(async () => {
    // A port nothing listens on: both instances run with their pubsub degraded to local.
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const { port } = probe.address() as AddressInfo;
    await new Promise((resolve) => probe.close(resolve));
    const env = { REDIS_URL: `redis://127.0.0.1:${port}`, ENGRAM_EMBEDDINGS: "offline" };
    first = await startTestEngram({ env });
    firstUrl = await first.listen();
    second = await startSecondInstance(first, env);
  });
  afterAll(async () => {
    await second?.stop();
    await first?.stop();
  });

  it("a key revoked on this instance loses its sockets here", async () => {
    expect(first.services.pubsub.mode()).toBe("degraded");
    await revokeAndExpectSilence(first, firstUrl);
  });

  it("and on the other instance, which never hears of it, once it checks its sockets' keys", async () => {
    const { data } = await first.gql(CREATE_KEY);
    const reader = client(second.url, data.createApiKey.key);
    const feed = collect(reader.ws, FEED);
    await settle(500);
    expect(reader.closes).toEqual([]);
    expect((await first.gql(REVOKE, { id: data.createApiKey.id })).errors).toBeUndefined();
    const closed = await until("the revoked key's socket on the other instance to close", async () => reader.closes[0]);
    expect(closed).toMatchObject({ code: 4401, reason: "API key revoked" });
    feed.dispose();
    await reader.ws.dispose();
  });
});
