import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { recordJobRun } from "../src/work/job-runs.ts";
import { recordModelUsage } from "../src/governance/usage.ts";
import { startTestEngram, type TenantKeys, type TestEngram } from "./helpers/engram.ts";
import { sseSubscribe } from "./helpers/sse.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";
import { recordTurn, type RecordedTurn } from "./helpers/turns.ts";

/**
 * Tenant A owns data; tenant B holds keys of every role and A's ids, and tries every query,
 * mutation and subscription of the schema with them.
 */

const APPEND = /* GraphQL */ `
  mutation Append($input: AppendEventInput!) { appendEvent(input: $input) { id } }
`;
const CREATE = /* GraphQL */ `
  mutation Create($input: CreateEntryInput!) { createEntry(input: $input) { id } }
`;

type Seeded = { eventId: string; entryId: string; jobRunId: string; apiKeyIds: string[] };

let engram: TestEngram;
let A: TenantKeys;
let B: TenantKeys;
let url: string;
let a: Seeded;
let b: Seeded;

async function runJob(tenantId: string, name: string) {
  return recordJobRun(forTenant(engram.services.db, tenantId), engram.services.pubsub, name, async () => ({
    status: "SUCCEEDED" as const,
    result: { tenant: name },
  }));
}

async function seed(keys: TenantKeys, word: string): Promise<Seeded> {
  const event = await engram.gql(
    APPEND,
    {
      input: {
        scope: "ENTITY",
        scopeRef: "shared-ref",
        kind: "decision",
        body: `${word} decided on the ROAS target.`,
        source: "crm",
        sourceRef: "same-ref-in-both-tenants",
      },
    },
    keys.writer,
  );
  const entry = await engram.gql(
    CREATE,
    {
      input: {
        scope: "ENTITY",
        scopeRef: "shared-ref",
        title: `${word} ROAS target`,
        summary: `${word} keeps ROAS above 3.`,
        tags: ["shared"],
        importance: 5,
      },
    },
    keys.writer,
  );
  expect(event.errors).toBeUndefined();
  expect(entry.errors).toBeUndefined();
  const eventId = event.data.appendEvent.id;
  const entryId = entry.data.createEntry.id;
  // What the compactor would do: fold the event into the entry.
  await engram.services.db.memoryEvent.update({ where: { id: eventId }, data: { entryId, compressedAt: new Date() } });
  const run = await runJob(keys.tenantId, `compact-${word}`);
  await recordModelUsage(forTenant(engram.services.db, keys.tenantId), {
    chain: "compactor",
    model: `model-${word}`,
    inputTokens: word === "alpha" ? 1000 : 10,
    outputTokens: word === "alpha" ? 100 : 1,
  });
  const keyRows = await engram.services.db.apiKey.findMany({ where: { tenantId: keys.tenantId } });
  return { eventId, entryId, jobRunId: run.id, apiKeyIds: keyRows.map((k) => k.id) };
}

/** Everything tenant A owns, straight from the store with the unscoped client. */
async function snapshotOf(tenantId: string) {
  const db = engram.services.db;
  const where = { where: { tenantId }, orderBy: { id: "asc" as const } };
  return {
    tenant: await db.tenant.findUnique({ where: { id: tenantId } }),
    events: await db.memoryEvent.findMany(where),
    entries: await db.memoryEntry.findMany(where),
    apiKeys: await db.apiKey.findMany(where),
    jobRuns: await db.jobRun.findMany(where),
    modelUsage: await db.modelUsage.findMany(where),
  };
}

let before: Awaited<ReturnType<typeof snapshotOf>>;

beforeAll(async () => {
  engram = await startTestEngram();
  A = engram.tenant;
  B = engram.other;
  url = await engram.listen();
  a = await seed(A, "alpha");
  b = await seed(B, "bravo");
  before = await snapshotOf(A.tenantId);
});
afterAll(() => engram?.stop());

const ids = (list: { id: string }[]) => list.map((row) => row.id);

function expectNotFound(result: Awaited<ReturnType<TestEngram["gql"]>>) {
  expect(result.errors).toHaveLength(1);
  expect(result.errors?.[0].extensions?.code).toBe("NOT_FOUND");
  expect(result.data ?? null).toBeNull();
}

describe("another tenant's ids", () => {
  const byId: [string, string, (s: Seeded) => string, (k: TenantKeys) => string][] = [
    ["event", `query($id: ID!) { event(id: $id) { id body } }`, (s) => s.eventId, (k) => k.reader],
    ["entry", `query($id: ID!) { entry(id: $id) { id title events { edges { node { id } } } } }`, (s) => s.entryId, (k) => k.reader],
    ["correctEntry", `mutation($id: ID!) { correctEntry(id: $id, input: { title: "pwned", importance: 1 }) { id title } }`, (s) => s.entryId, (k) => k.writer],
    ["forgetEntry", `mutation($id: ID!) { forgetEntry(id: $id) { change entryId entry { id } } }`, (s) => s.entryId, (k) => k.writer],
    ["revokeApiKey", `mutation($id: ID!) { revokeApiKey(id: $id) { id revokedAt } }`, (s) => s.apiKeyIds[0], (k) => k.admin],
  ];

  it.each(byId)("%s answers NOT_FOUND and no data to every key of the other tenant", async (_name, query, idOf, _keyOf) => {
    for (const key of [B.admin, B.writer, B.reader]) {
      const result = await engram.gql(query, { id: idOf(a) }, key);
      // A reader asking for a write is refused for its role first; that still reveals nothing.
      const code = result.errors?.[0].extensions?.code;
      if (code === "FORBIDDEN") {
        expect(result.data ?? null).toBeNull();
        continue;
      }
      expectNotFound(result);
    }
  });

  it.each(byId)("%s answers A's id exactly as it answers an id that does not exist", async (_name, query, idOf, keyOf) => {
    const missing = "00000000-0000-4000-8000-000000000000";
    const forA = await engram.gql(query, { id: idOf(a) }, keyOf(B));
    const forNothing = await engram.gql(query, { id: missing }, keyOf(B));
    expectNotFound(forA);
    expect(forA.errors?.[0].message.replace(idOf(a), "<id>")).toBe(forNothing.errors?.[0].message.replace(missing, "<id>"));
  });

  // The mutations would change A's rows; the reads show the ids are real.
  it.each(byId.filter(([name]) => name === "event" || name === "entry"))("%s answers the owning tenant", async (_name, query, idOf, keyOf) => {
    const result = await engram.gql(query, { id: idOf(a) }, keyOf(A));
    expect(result.errors).toBeUndefined();
  });
});

describe("another tenant's lists", () => {
  it("events: only the caller's own, whatever the filters", async () => {
    const queries = [
      `{ events(includeCompressed: true, first: 100) { edges { node { id } } } }`,
      `{ events(scope: ENTITY, scopeRef: "shared-ref", includeCompressed: true) { edges { node { id } } } }`,
      `{ events(kind: "decision", includeCompressed: true) { edges { node { id } } } }`,
    ];
    for (const query of queries) {
      const result = await engram.gql(query, {}, B.reader);
      expect(result.errors).toBeUndefined();
      expect(result.data.events.edges.map((e: any) => e.node.id)).toEqual([b.eventId]);
    }
  });

  it("a page cursor naming another tenant's row pages nothing, as one naming no row", async () => {
    // An event of B's that sorts after every other (newest first): a page from any place holds it.
    const old = await engram.gql(
      APPEND,
      { input: { scope: "PROJECT", scopeRef: "paging", kind: "note", body: "old", source: "test", occurredAt: "2001-01-01T00:00:00Z" } },
      B.writer,
    );
    expect(old.errors).toBeUndefined();
    try {
      const cursorOf = (id: string) => Buffer.from(`GPC:S:${id}`).toString("base64");
      const page = `query($after: String) { events(after: $after, includeCompressed: true) { edges { node { id } } } }`;
      const own = await engram.gql(page, { after: cursorOf(b.eventId) }, B.reader);
      expect(own.data.events.edges).toEqual([{ node: { id: old.data.appendEvent.id } }]);
      // A's event places B's page nowhere, as an id no one has: whether it exists does not show.
      for (const id of [a.eventId, "no-such-event"]) {
        const result = await engram.gql(page, { after: cursorOf(id) }, B.reader);
        expect(result.errors).toBeUndefined();
        expect(result.data.events.edges).toEqual([]);
      }
    } finally {
      await engram.services.db.memoryEvent.delete({ where: { id: old.data.appendEvent.id } });
    }
  });

  it("entries: only the caller's own, by scope, tags or full-text search", async () => {
    const queries = [
      `{ entries(first: 100) { edges { node { id } } } }`,
      `{ entries(scope: ENTITY, scopeRef: "shared-ref") { edges { node { id } } } }`,
      `{ entries(tags: ["shared"]) { edges { node { id } } } }`,
      `{ entries(search: "ROAS") { edges { node { id } } } }`,
      `{ entries(search: "ROAS", tags: ["shared"], scope: ENTITY, scopeRef: "shared-ref") { edges { node { id } } } }`,
    ];
    for (const query of queries) {
      const result = await engram.gql(query, {}, B.reader);
      expect(result.errors).toBeUndefined();
      expect(result.data.entries.edges.map((e: any) => e.node.id)).toEqual([b.entryId]);
    }
    const alphaOnly = await engram.gql(`{ entries(search: "alpha") { edges { node { id } } } }`, {}, B.reader);
    expect(alphaOnly.data.entries.edges).toEqual([]);
    const forA = await engram.gql(`{ entries(search: "alpha") { edges { node { id } } } }`, {}, A.reader);
    expect(forA.data.entries.edges.map((e: any) => e.node.id)).toEqual([a.entryId]);
  });

  it("an entry's events: only the caller's own", async () => {
    const result = await engram.gql(
      `query($id: ID!) { entry(id: $id) { events { edges { node { id entry { id } } } } } }`,
      { id: b.entryId },
      B.reader,
    );
    expect(result.data.entry.events.edges).toEqual([{ node: { id: b.eventId, entry: { id: b.entryId } } }]);
  });

  it("apiKeys: exactly the caller's own keys", async () => {
    const result = await engram.gql(`{ apiKeys { id prefix } }`, {}, B.admin);
    expect(result.errors).toBeUndefined();
    expect(ids(result.data.apiKeys).sort()).toEqual([...b.apiKeyIds].sort());
  });

  it("jobRuns: only the caller's own runs", async () => {
    for (const query of [`{ jobRuns(first: 100) { id name } }`, `{ jobRuns(name: "compact-alpha") { id } }`]) {
      const result = await engram.gql(query, {}, B.reader);
      expect(result.errors).toBeUndefined();
      expect(ids(result.data.jobRuns)).not.toContain(a.jobRunId);
    }
    const own = await engram.gql(`{ jobRuns(first: 100) { id } }`, {}, B.reader);
    expect(ids(own.data.jobRuns)).toEqual([b.jobRunId]);
  });

  it("modelUsage: only the caller's own tokens", async () => {
    const result = await engram.gql(`{ modelUsage { inputTokens outputTokens rows { model calls } } }`, {}, B.reader);
    expect(result.errors).toBeUndefined();
    expect(result.data.modelUsage).toEqual({ inputTokens: 10, outputTokens: 1, rows: [{ model: "model-bravo", calls: 1 }] });
  });

  it("viewer: the caller's own tenant", async () => {
    const result = await engram.gql(`{ viewer { role tenant { id name } } }`, {}, B.reader);
    expect(result.data.viewer).toEqual({ role: "READER", tenant: { id: B.tenantId, name: "tenant-b" } });
  });

  it("an idempotent append with the same source + sourceRef as another tenant's makes the caller's own event", async () => {
    expect(b.eventId).not.toBe(a.eventId);
    const again = await engram.gql(
      APPEND,
      { input: { scope: "ENTITY", scopeRef: "shared-ref", kind: "decision", body: "retry", source: "crm", sourceRef: "same-ref-in-both-tenants" } },
      B.writer,
    );
    expect(again.data.appendEvent.id).toBe(b.eventId);
  });
});

describe("subscriptions across tenants", () => {
  const SUBSCRIPTIONS = {
    events: `subscription { eventAppended { id } }`,
    eventsFiltered: `subscription { eventAppended(scope: ENTITY, scopeRef: "live-ref") { id } }`,
    entries: `subscription { entryChanged { change entryId entry { id } } }`,
    entriesFiltered: `subscription { entryChanged(scope: ENTITY, scopeRef: "live-ref") { change entryId } }`,
    jobs: `subscription { jobRunChanged { id name } }`,
  };

  it("never delivers one tenant's changes to another tenant's subscribers", async () => {
    const clientA = wsClient(url, A.reader);
    const clientB = wsClient(url, B.reader);
    const subsA = Object.fromEntries(Object.entries(SUBSCRIPTIONS).map(([k, q]) => [k, collect(clientA, q)]));
    const subsB = Object.fromEntries(Object.entries(SUBSCRIPTIONS).map(([k, q]) => [k, collect(clientB, q)]));
    const sseB = await sseSubscribe(url, B.reader, SUBSCRIPTIONS.events);
    await settle();

    // B's failed attempts on A's entry announce nothing to anyone.
    await engram.gql(`mutation($id: ID!) { correctEntry(id: $id, input: { title: "pwned" }) { id } }`, { id: a.entryId }, B.writer);
    await engram.gql(`mutation($id: ID!) { forgetEntry(id: $id) { entryId } }`, { id: a.entryId }, B.writer);

    // A's activity, which A's subscribers see.
    const aEvent = await engram.gql(
      APPEND,
      { input: { scope: "ENTITY", scopeRef: "live-ref", kind: "note", body: "alpha live", source: "crm" } },
      A.writer,
    );
    const aEntry = await engram.gql(
      CREATE,
      { input: { scope: "ENTITY", scopeRef: "live-ref", title: "alpha live", summary: "alpha" } },
      A.writer,
    );
    const aEntryId = aEntry.data.createEntry.id;
    await subsA.entries.next(1);
    await engram.gql(`mutation($id: ID!) { forgetEntry(id: $id) { entryId } }`, { id: aEntryId }, A.writer);
    const aRun = await runJob(A.tenantId, "alpha-live");

    await subsA.events.next(1);
    await subsA.eventsFiltered.next(1);
    await subsA.entries.next(2);
    await subsA.entriesFiltered.next(2);
    await subsA.jobs.next(2);
    expect(subsA.events.received[0].data.eventAppended.id).toBe(aEvent.data.appendEvent.id);
    expect(subsA.eventsFiltered.received[0].data.eventAppended.id).toBe(aEvent.data.appendEvent.id);
    expect(subsA.entries.received.map((r) => r.data.entryChanged.change)).toEqual(["CREATED", "FORGOTTEN"]);
    expect(subsA.entries.received.map((r) => r.data.entryChanged.entryId)).toEqual([aEntryId, aEntryId]);
    expect(subsA.entriesFiltered.received.map((r) => r.data.entryChanged.entryId)).toEqual([aEntryId, aEntryId]);
    expect(subsA.jobs.received.map((r) => r.data.jobRunChanged.id)).toEqual([aRun.id, aRun.id]);

    // Then B's own activity: the first thing each B subscriber hears must be B's, not A's.
    const bEvent = await engram.gql(
      APPEND,
      { input: { scope: "ENTITY", scopeRef: "live-ref", kind: "note", body: "bravo live", source: "crm" } },
      B.writer,
    );
    const bEntry = await engram.gql(
      CREATE,
      { input: { scope: "ENTITY", scopeRef: "live-ref", title: "bravo live", summary: "bravo" } },
      B.writer,
    );
    const bRun = await runJob(B.tenantId, "bravo-live");

    const bEventId = bEvent.data.appendEvent.id;
    const bEntryId = bEntry.data.createEntry.id;
    expect((await subsB.events.next(1)).data.eventAppended.id).toBe(bEventId);
    expect((await subsB.eventsFiltered.next(1)).data.eventAppended.id).toBe(bEventId);
    expect((await subsB.entries.next(1)).data.entryChanged).toEqual({ change: "CREATED", entryId: bEntryId, entry: { id: bEntryId } });
    expect((await subsB.entriesFiltered.next(1)).data.entryChanged.entryId).toBe(bEntryId);
    expect((await subsB.jobs.next(1)).data.jobRunChanged).toEqual({ id: bRun.id, name: "bravo-live" });
    expect((await sseB.next(1))?.data?.eventAppended.id).toBe(bEventId);
    for (const sub of Object.values(subsB)) expect(sub.failure).toBeUndefined();

    for (const sub of [...Object.values(subsA), ...Object.values(subsB)]) sub.dispose();
    sseB.close();
    await clientA.dispose();
    await clientB.dispose();
  });
});

describe("conversations across tenants", () => {
  // Both tenants use the same external ids: they must still get separate rows.
  const turn = (clientTurnId: string, userMessage: string) => ({
    agentExternalId: "support-bot",
    endUserExternalId: "user-1",
    conversationExternalId: "conv-1",
    clientTurnId,
    userMessage,
    assistantMessage: "Noted.",
  });
  let aTurn: RecordedTurn;

  beforeAll(async () => {
    aTurn = await recordTurn(engram, turn("a-t1", "alpha wants a refund"), A.writer);
  });

  it("answers NOT_FOUND to B for A's agent, end user, conversation, summary revisions and context", async () => {
    const cases: [string, Record<string, unknown>][] = [
      [`query($id: ID!) { agent(id: $id) { id externalId } }`, { id: aTurn.conversation.agent.id }],
      [`query($id: ID!) { endUser(id: $id) { id externalId } }`, { id: aTurn.conversation.endUser.id }],
      [`query($id: ID!) { conversation(id: $id) { id summary } }`, { id: aTurn.conversation.id }],
      [`query($id: ID!) { summaryRevisions(conversationId: $id) { id text } }`, { id: aTurn.conversation.id }],
      [
        `query($id: ID!) { context(input: { conversationId: $id, message: "what did alpha want?" }) { totalTokens blocks { text } } }`,
        { id: aTurn.conversation.id },
      ],
    ];
    for (const [query, variables] of cases) {
      expectNotFound(await engram.gql(query, variables, B.reader));
      expect((await engram.gql(query, variables, A.reader)).errors).toBeUndefined();
    }
  });

  it("lists only B's own agents, end users and conversations, even filtered by A's ids", async () => {
    const agents = await engram.gql(`{ agents { id } }`, {}, B.reader);
    expect(ids(agents.data.agents)).not.toContain(aTurn.conversation.agent.id);
    const endUsers = await engram.gql(`{ endUsers { edges { node { id } } } }`, {}, B.reader);
    expect(endUsers.data.endUsers.edges.map((e: any) => e.node.id)).not.toContain(aTurn.conversation.endUser.id);
    for (const args of ["", `(agentId: "${aTurn.conversation.agent.id}")`, `(endUserId: "${aTurn.conversation.endUser.id}")`]) {
      const conversations = await engram.gql(`{ conversations${args} { edges { node { id } } } }`, {}, B.reader);
      expect(conversations.errors).toBeUndefined();
      expect(conversations.data.conversations.edges).toEqual([]);
    }
  });

  it("gives B its own rows for the same external ids and never touches A's", async () => {
    const beforeRows = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: aTurn.conversation.id } });
    const bTurn = await recordTurn(engram, turn("a-t1", "bravo, same client turn id"), B.writer);
    expect(bTurn.id).not.toBe(aTurn.id);
    expect(bTurn.conversation.id).not.toBe(aTurn.conversation.id);
    expect(bTurn.conversation.agent.id).not.toBe(aTurn.conversation.agent.id);

    const agent = await engram.gql(`mutation { upsertAgent(input: { externalId: "support-bot", name: "B's bot" }) { id } }`, {}, B.admin);
    expect(agent.data.upsertAgent.id).toBe(bTurn.conversation.agent.id);
    const user = await engram.gql(`mutation { upsertEndUser(input: { externalId: "user-1", displayName: "B's user" }) { id } }`, {}, B.writer);
    expect(user.data.upsertEndUser.id).toBe(bTurn.conversation.endUser.id);
    const imported = await engram.gql(
      `mutation { importConversation(input: { agentExternalId: "support-bot", endUserExternalId: "user-1", conversationExternalId: "imported-1", messages: [{ role: USER, content: "hi" }] }) { id agent { id } } }`,
      {},
      B.writer,
    );
    expect(imported.errors).toBeUndefined();
    expect(imported.data.importConversation.agent.id).toBe(bTurn.conversation.agent.id);

    const db = engram.services.db;
    expect(await db.conversation.findUniqueOrThrow({ where: { id: aTurn.conversation.id } })).toEqual(beforeRows);
    expect(await db.agent.findUniqueOrThrow({ where: { id: aTurn.conversation.agent.id } })).toMatchObject({ tenantId: A.tenantId, externalId: "support-bot" });
    expect((await db.agent.findUniqueOrThrow({ where: { id: aTurn.conversation.agent.id } })).name).not.toBe("B's bot");
    expect(await db.message.count({ where: { conversationId: aTurn.conversation.id } })).toBe(2);
  });

  it("never delivers A's turns to B, even subscribed with A's agent id or conversation id", async () => {
    const bAgent = await engram.gql(`mutation { upsertAgent(input: { externalId: "support-bot" }) { id } }`, {}, B.admin);
    const client = wsClient(url, B.reader);
    const onAsAgent = collect(client, `subscription($id: ID!) { turnRecorded(agentId: $id) { id } }`, { id: aTurn.conversation.agent.id });
    const onAsSummary = collect(client, `subscription($id: ID!) { summaryChanged(conversationId: $id) { id } }`, { id: aTurn.conversation.id });
    const onOwn = collect(client, `subscription($id: ID!) { turnRecorded(agentId: $id) { id } }`, { id: bAgent.data.upsertAgent.id });
    await settle();

    await recordTurn(engram, turn("a-t2", "alpha again"), A.writer);
    const bTurn = await recordTurn(engram, turn("b-t2", "bravo again"), B.writer);
    // B's own turn arrives after A's was published; by then A's would have arrived too.
    expect((await onOwn.next(1)).data.turnRecorded.id).toBe(bTurn.id);
    expect(onAsAgent.received).toEqual([]);
    expect(onAsSummary.received).toEqual([]);
    expect(onAsAgent.failure).toBeUndefined();
    for (const sub of [onAsAgent, onAsSummary, onOwn]) sub.dispose();
    await client.dispose();
  });
});

describe("connections without a valid key", () => {
  it("refuses a WebSocket connection with a missing, unknown, malformed or revoked key; it receives nothing", async () => {
    const revoked = await engram.gql(`mutation { createApiKey(role: READER, name: "soon revoked") { id key } }`, {}, A.admin);
    await engram.gql(`mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, { id: revoked.data.createApiKey.id }, A.admin);

    for (const key of [null, "egm_not-a-real-key", "Basic abc", revoked.data.createApiKey.key]) {
      const client = wsClient(url, key);
      const sub = collect(client, `subscription { eventAppended { id body } }`);
      await sub.next(1);
      expect(sub.failure).toMatchObject({ code: 4403 });
      await engram.gql(APPEND, { input: { scope: "TEAM", scopeRef: "t", kind: "k", body: "after refusal", source: "s" } }, A.writer);
      expect(sub.received).toEqual([]);
      await client.dispose();
    }
  });

  it("answers an SSE subscription without a valid key with UNAUTHENTICATED and no data", async () => {
    for (const key of [null, "egm_not-a-real-key"]) {
      const sub = await sseSubscribe(url, key, `subscription { eventAppended { id body } }`);
      const first = await sub.next(1);
      if (sub.status === 200) {
        expect(first?.errors?.[0].extensions?.code).toBe("UNAUTHENTICATED");
        expect(first?.data ?? null).toBeNull();
      } else {
        expect(sub.status).toBe(401);
      }
      expect(sub.received.every((r) => !r.data)).toBe(true);
      sub.close();
    }
  });
});

describe("tenant A afterwards", () => {
  it("has every row exactly as before B's attempts, and its keys still work", async () => {
    const after = await snapshotOf(A.tenantId);
    // Only the live subscription test and the key-refusal test add to A; compare what was seeded.
    expect(after.tenant).toEqual(before.tenant);
    expect(after.entries.find((e) => e.id === a.entryId)).toEqual(before.entries.find((e) => e.id === a.entryId));
    expect(after.events.find((e) => e.id === a.eventId)).toEqual(before.events.find((e) => e.id === a.eventId));
    for (const key of before.apiKeys) expect(after.apiKeys.find((k) => k.id === key.id)).toEqual(key);
    expect(after.jobRuns.find((r) => r.id === a.jobRunId)).toEqual(before.jobRuns.find((r) => r.id === a.jobRunId));
    expect(after.modelUsage).toEqual(before.modelUsage);

    const stillThere = await engram.gql(`query($id: ID!) { entry(id: $id) { title } }`, { id: a.entryId }, A.reader);
    expect(stillThere.data.entry.title).toBe("alpha ROAS target");
    for (const key of [A.admin, A.writer, A.reader]) {
      const viewer = await engram.gql(`{ viewer { tenant { id } } }`, {}, key);
      expect(viewer.data.viewer.tenant.id).toBe(A.tenantId);
    }
  });
});
