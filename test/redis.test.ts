import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomUUID } from "node:crypto";
import { createEngramPubSub, type PubSub } from "../src/pubsub.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance, testRedisUrl, type TestInstance } from "./helpers/instances.ts";
import { until } from "./helpers/until.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

const APPEND = /* GraphQL */ `
  mutation Append($input: AppendEventInput!) { appendEvent(input: $input) { id } }
`;

const SUBSCRIBE = /* GraphQL */ `
  subscription { eventAppended { id scopeRef body } }
`;

async function postGraphQL(url: string, key: string, query: string, variables: Record<string, unknown>) {
  const response = await fetch(`${url}/graphql`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ query, variables }),
  });
  return (await response.json()) as { data?: any; errors?: unknown[] };
}

describe("several API instances sharing one store and Redis", () => {
  let first: TestEngram;
  let second: TestInstance;
  let firstUrl: string;
  const clients: ReturnType<typeof wsClient>[] = [];

  beforeAll(async () => {
    const REDIS_URL = await testRedisUrl();
    first = await startTestEngram({ env: { REDIS_URL } });
    firstUrl = await first.listen();
    second = await startSecondInstance(first, { REDIS_URL });
  });
  afterAll(async () => {
    await Promise.allSettled(clients.map((client) => client.dispose()));
    await second?.stop();
    await first?.stop();
  });

  it("delivers an event appended over HTTP on one instance to a subscriber on the other", async () => {
    const client = wsClient(second.url, first.tenant.reader);
    const otherClient = wsClient(second.url, first.other.reader);
    clients.push(client, otherClient);
    const feed = collect(client, SUBSCRIBE);
    const otherFeed = collect(otherClient, SUBSCRIBE);
    await settle(500);

    const appended = await postGraphQL(firstUrl, first.tenant.writer, APPEND, {
      input: { scope: "PROJECT", scopeRef: "launch-q3", kind: "decision", body: "Cut ROAS target to 3.", source: "crm", sourceRef: "r-1" },
    });
    expect(appended.errors).toBeUndefined();

    const received = await feed.next(1, 20_000);
    expect(received.errors).toBeUndefined();
    expect(received.data).toEqual({
      eventAppended: { id: appended.data.appendEvent.id, scopeRef: "launch-q3", body: "Cut ROAS target to 3." },
    });

    // The other tenant's subscriber on the same instance hears only its own tenant.
    const own = await postGraphQL(firstUrl, first.other.writer, APPEND, {
      input: { scope: "PROJECT", scopeRef: "b-only", kind: "decision", body: "Tenant B moment.", source: "crm", sourceRef: "r-1" },
    });
    expect(own.errors).toBeUndefined();
    const otherReceived = await otherFeed.next(1, 20_000);
    expect(otherReceived.data?.eventAppended.id).toBe(own.data.appendEvent.id);
    await settle(500);
    expect(otherFeed.received).toHaveLength(1);
    expect(feed.received).toHaveLength(1);

    // A retry of the same source + sourceRef creates nothing, so announces nothing.
    const retry = await postGraphQL(firstUrl, first.tenant.writer, APPEND, {
      input: { scope: "PROJECT", scopeRef: "launch-q3", kind: "decision", body: "Cut ROAS target to 3.", source: "crm", sourceRef: "r-1" },
    });
    expect(retry.data.appendEvent.id).toBe(appended.data.appendEvent.id);
    await settle(500);
    expect(feed.received).toHaveLength(1);
  });

  it("also carries events the other way, from the second instance to a subscriber on the first", async () => {
    const client = wsClient(firstUrl, first.tenant.reader);
    clients.push(client);
    const feed = collect(client, `subscription { eventAppended(scopeRef: "reverse") { id } }`);
    await settle(500);
    const appended = await postGraphQL(second.url, first.tenant.writer, APPEND, {
      input: { scope: "TEAM", scopeRef: "reverse", kind: "note", body: "From instance two.", source: "crm", sourceRef: "r-2" },
    });
    expect(appended.errors).toBeUndefined();
    const received = await feed.next(1, 20_000);
    expect(received.data?.eventAppended.id).toBe(appended.data.appendEvent.id);
  });
});

// Redis's channels are the server's, whatever the database: two deployments kept apart by the
// database of their REDIS_URL (redis://cache/1 and redis://cache/2, say production and a staging
// copy of its database, with the same tenant ids) heard each other's announcements, a recall's
// whole record (the user's message, the snippets' texts) included.
describe("deployments on different databases of one Redis", () => {
  const pubsubs: PubSub[] = [];
  afterAll(async () => {
    await Promise.allSettled(pubsubs.map((pubsub) => pubsub.close()));
  });

  it("hear only their own announcements", async () => {
    const onDatabase = async (db: number) => {
      const url = new URL(await testRedisUrl());
      url.pathname = `/${db}`;
      const pubsub = createEngramPubSub(url.toString());
      pubsubs.push(pubsub);
      await until(`Redis database ${db} to be ready`, async () => pubsub.mode() === "redis", 20_000);
      return pubsub;
    };
    const [production, productionSubscriber, staging] = [await onDatabase(14), await onDatabase(14), await onDatabase(15)];
    const tenantId = `tenant-${randomUUID()}`;
    const heard = (pubsub: PubSub) => {
      const ids: string[] = [];
      void (async () => {
        for await (const { id } of pubsub.subscribe("eventAppended", tenantId)) ids.push(id);
      })();
      return ids;
    };
    const onStaging = heard(staging);
    const onProduction = heard(productionSubscriber);
    const announce = (pubsub: PubSub, id: string) => pubsub.publish("eventAppended", tenantId, { id, scope: "PROJECT", scopeRef: "p" });

    // Staging listens (its own announcement reaches it), then production's reaches its own subscriber.
    await until("staging to listen", async () => (announce(staging, "staging-ready"), onStaging.includes("staging-ready")), 20_000);
    await until("production's announcement to go through Redis", async () => (announce(production, "production"), onProduction.includes("production")), 20_000);
    // Staging's next announcement comes after production's on staging's one connection.
    await until("staging to hear its own again", async () => (announce(staging, "staging-after"), onStaging.includes("staging-after")), 20_000);
    expect(onStaging).not.toContain("production");
    expect(onProduction).not.toContain("staging-ready");
  });
});
