import { spawn, type ChildProcess } from "node:child_process";
import net, { type AddressInfo } from "node:net";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { redisAnswers } from "./helpers/instances.ts";
import { until } from "./helpers/until.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

const APPEND = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`;

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A Redis of this test's own (the shared one on 6379 must never be stopped). */
async function startRedis(port: number): Promise<ChildProcess> {
  const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdio: "ignore" });
  await until("redis to answer", () => redisAnswers(`redis://127.0.0.1:${port}`, 500), 10_000);
  return child;
}

async function kill(child: ChildProcess) {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await exited;
}

/** An Engram on a Redis of this test's own. */
async function engramOnOwnRedis() {
  const port = await freePort();
  const redis = await startRedis(port);
  const engram = await startTestEngram({ env: { REDIS_URL: `redis://127.0.0.1:${port}`, ENGRAM_EMBEDDINGS: "offline" } });
  return { port, redis, engram };
}

/** Appends notes to PROJECT/scopeRef, each with a sourceRef of its own. */
function appender(engram: () => TestEngram, scopeRef: string) {
  let n = 0;
  return (body: string) =>
    engram().gql(APPEND, { input: { scope: "PROJECT", scopeRef, kind: "note", body, source: "test", sourceRef: `${scopeRef}-${n++}` } }, engram().tenant.writer);
}

/** A WebSocket subscriber to PROJECT/scopeRef's events, once the pubsub runs through Redis. */
async function subscribedThroughRedis(engram: TestEngram, scopeRef: string) {
  const url = await engram.listen();
  const client = wsClient(url, engram.tenant.reader);
  const feed = collect(client, `subscription { eventAppended(scope: PROJECT, scopeRef: "${scopeRef}") { body } }`);
  await until("pubsub on redis", async () => engram.services.pubsub.mode() === "redis");
  await settle(500);
  return { url, client, feed };
}

describe("a Redis outage", () => {
  let engram: TestEngram;
  let redis: ChildProcess;
  let port: number;
  const append = appender(() => engram, "outage");

  beforeAll(async () => {
    ({ port, redis, engram } = await engramOnOwnRedis());
  });
  afterAll(async () => {
    await engram?.stop();
    if (redis) await kill(redis);
  });

  it("never affects writes; subscriptions go local while it is down and back through Redis after", async () => {
    const { url, client, feed } = await subscribedThroughRedis(engram, "outage");
    expect((await append("before")).errors).toBeUndefined();
    await feed.next(1);
    const health = async () => {
      const response = await fetch(`${url}/healthz`);
      return { code: response.status, ...(await response.json()) };
    };
    expect((await health()).components.redis).toEqual({ status: "ok" });

    // Kill Redis in the middle of a burst of writes: every write is acknowledged.
    const burst: Promise<unknown>[] = [];
    for (let i = 0; i < 20; i++) {
      burst.push(append(`during ${i}`));
      if (i === 5) await kill(redis);
    }
    const results = (await Promise.all(burst)) as { errors?: unknown }[];
    expect(results.filter((r) => r.errors)).toEqual([]);
    for (let i = 0; i < 5; i++) expect((await append(`down ${i}`)).errors).toBeUndefined();
    expect(engram.services.pubsub.mode()).toBe("degraded");
    // /healthz says so: still 200 (writes and this instance's subscribers work), but degraded.
    const down = await health();
    expect(down).toMatchObject({ code: 200, status: "degraded", components: { redis: { status: "down" } } });
    expect(down.components.redis.detail).toMatch(/no connection to Redis/);
    // This instance's subscriber still hears this instance's writes.
    await until("the writes made while Redis was down", async () => feed.received.some((r) => r.data?.eventAppended.body === "down 4"));
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "outage" } })).toBe(26);

    // Redis comes back on the same port: the pubsub reconnects and publishes through it again.
    redis = await startRedis(port);
    await until("pubsub back on redis", async () => engram.services.pubsub.mode() === "redis");
    expect((await health()).components.redis).toEqual({ status: "ok" });
    const watcher = new Redis(`redis://127.0.0.1:${port}`);
    const heard: string[] = [];
    watcher.on("pmessage", (_pattern, channel) => heard.push(channel));
    await watcher.psubscribe("eventAppended:*");
    await settle(500);
    expect((await append("after")).errors).toBeUndefined();
    await until("the event through redis", async () => heard.length > 0);
    await until("the subscriber to hear it", async () => feed.received.some((r) => r.data?.eventAppended.body === "after"));
    watcher.disconnect();
    feed.dispose();
    feed.dispose();
    await client.dispose();
  });
});

// A Redis whose connection stays open but answers nothing (here, its process stopped with
// SIGSTOP): its client still says "ready". Before, a publish waited on it for ever, so an event
// reached no subscriber at all, not even this instance's, and /healthz said Redis was ok.
describe("a stalled Redis", () => {
  let engram: TestEngram;
  let redis: ChildProcess;
  const append = appender(() => engram, "stall");

  beforeAll(async () => {
    ({ redis, engram } = await engramOnOwnRedis());
  });
  let stopped = false;
  afterAll(async () => {
    if (redis?.exitCode === null) redis.kill("SIGCONT");
    if (!stopped) await engram?.stop();
    if (redis) await kill(redis);
  });

  it("delivers this instance's events to its own subscribers, and /healthz says Redis does not answer", async () => {
    const { url, client, feed } = await subscribedThroughRedis(engram, "stall");
    expect((await append("before")).errors).toBeUndefined();
    await feed.next(1);
    redis.kill("SIGSTOP");
    for (const body of ["stalled 1", "stalled 2", "stalled 3"]) expect((await append(body)).errors).toBeUndefined();
    await feed.next(4);
    expect(feed.received.slice(1).map((e: any) => e.data.eventAppended.body).sort()).toEqual(["stalled 1", "stalled 2", "stalled 3"]);
    const health = await (await fetch(`${url}/healthz`)).json();
    expect(health).toMatchObject({ status: "degraded", components: { redis: { status: "down", detail: expect.stringMatching(/does not answer/) } } });
    redis.kill("SIGCONT");
    await until("/healthz to say Redis is ok again", async () => (await (await fetch(`${url}/healthz`)).json()).components.redis.status === "ok", 20_000);
    // The publish that timed out was sent all the same, and Redis passes it on once it answers:
    // that late copy is not delivered a second time.
    expect((await append("after")).errors).toBeUndefined();
    await until("the event after the stall", async () => feed.received.some((r: any) => r.data?.eventAppended.body === "after"));
    expect(feed.received.map((r: any) => r.data.eventAppended.body).sort()).toEqual(["after", "before", "stalled 1", "stalled 2", "stalled 3"]);
    feed.dispose();
    await client.dispose();
  });

  it("does not hold the shutdown: the pubsub of a stalled Redis closes at once", async () => {
    redis.kill("SIGSTOP");
    expect((await append("at the end")).errors).toBeUndefined();
    await until("Redis to count as stalled", async () => engram.services.pubsub.mode() === "degraded", 10_000);
    const warnings: string[] = [];
    const warn = engram.services.log.warn.bind(engram.services.log);
    engram.services.log.warn = (message: string, fields?: object) => {
      warnings.push(message);
      warn(message, fields);
    };
    stopped = true;
    await engram.stop();
    // Before, QUIT waited on Redis until the close's 5 s step gave up on it.
    expect(warnings.filter((w) => /while closing/.test(w))).toEqual([]);
    redis.kill("SIGCONT");
  });
});

/**
 * A TCP proxy in front of Redis that can make the connections that subscribed go silent (they
 * stay open, and nothing passes either way), as a load balancer or NAT does that drops an idle
 * connection without a word: a subscriber's connection is idle whenever no one announces. New
 * connections pass as before.
 */
async function startSilencingProxy(redisPort: number) {
  const connections: { subscriber: boolean; silent: boolean; sockets: net.Socket[] }[] = [];
  const server = net.createServer((client) => {
    const upstream = net.connect(redisPort, "127.0.0.1");
    const connection = { subscriber: false, silent: false, sockets: [client, upstream] };
    connections.push(connection);
    client.on("data", (data) => {
      if (/subscribe/i.test(data.toString())) connection.subscriber = true;
      if (!connection.silent) upstream.write(data);
    });
    upstream.on("data", (data) => {
      if (!connection.silent) client.write(data);
    });
    for (const socket of connection.sockets) socket.on("error", () => {}).on("close", () => connection.sockets.forEach((s) => s.destroy()));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    silenceSubscribers() {
      for (const connection of connections) if (connection.subscriber) connection.silent = true;
    },
    async stop() {
      for (const { sockets } of connections) sockets.forEach((s) => s.destroy());
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

// The connection that subscribed going silent (dropped by something in between, without a word)
// looked ready to its client: this instance's subscribers heard nothing more, its own events
// included (they come back through Redis), and /healthz said Redis was ok, since it asked the
// other connection. Nothing noticed until the operating system's keepalive, hours later.
describe("a subscription connection that goes silent", () => {
  let engram: TestEngram;
  let redis: ChildProcess;
  let proxy: Awaited<ReturnType<typeof startSilencingProxy>>;
  const append = appender(() => engram, "silent");

  beforeAll(async () => {
    const port = await freePort();
    redis = await startRedis(port);
    proxy = await startSilencingProxy(port);
    engram = await startTestEngram({ env: { REDIS_URL: `redis://127.0.0.1:${proxy.port}`, ENGRAM_EMBEDDINGS: "offline" } });
  });
  afterAll(async () => {
    await engram?.stop();
    await proxy?.stop();
    if (redis) await kill(redis);
  });

  it("is noticed by /healthz and connected again, and the events go on reaching the subscribers", async () => {
    const { url, client, feed } = await subscribedThroughRedis(engram, "silent");
    expect((await append("before")).errors).toBeUndefined();
    await feed.next(1);
    const heard = (body: string) => feed.received.some((r: any) => r.data?.eventAppended.body.startsWith(body));

    proxy.silenceSubscribers();
    const health = await (await fetch(`${url}/healthz`)).json();
    expect(health).toMatchObject({ status: "degraded", components: { redis: { status: "down" } } });
    let n = 0;
    await until("this instance's events to reach its subscriber again", async () => {
      expect((await append(`silent ${n++}`)).errors).toBeUndefined();
      return heard("silent ");
    }, 30_000);

    await until("/healthz to say Redis is ok again", async () => (await (await fetch(`${url}/healthz`)).json()).components.redis.status === "ok", 30_000);
    await until("the subscription to go through Redis again", async () => engram.services.pubsub.mode() === "redis", 30_000);
    expect((await append("after")).errors).toBeUndefined();
    await until("the event after", async () => heard("after"));
    // Each event at most once.
    const bodies = feed.received.map((r: any) => r.data.eventAppended.body);
    expect(new Set(bodies).size).toBe(bodies.length);
    feed.dispose();
    await client.dispose();
  }, 120_000);
});
