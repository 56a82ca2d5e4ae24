import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startSecondInstance, testRedisUrl, type TestInstance } from "./helpers/instances.ts";
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
