import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { forTenant, insertRows } from "../src/db.ts";
import { AppendEventDocument, type AppendEventInput } from "../src/gql/graphql.ts";
import { appendEvent } from "../src/memory/log/events.ts";
import { recordJobRun } from "../src/work/job-runs.ts";
import { createTenantWithKeys, startTestEngram, type GraphQLResult, type TestEngram } from "./helpers/engram.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

const APPEND = AppendEventDocument;

const event = (overrides: Partial<AppendEventInput> = {}): AppendEventInput => ({
  scope: "PROJECT",
  scopeRef: "launch-q3",
  kind: "decision",
  body: "We **cut** the ROAS target to 3.",
  source: "crm-skill",
  ...overrides,
});

let engram: TestEngram;
beforeAll(async () => {
  engram = await startTestEngram();
});
afterAll(() => engram?.stop());

describe("appendEvent", () => {
  it("answers the event's own fields from the write, as reading it back does", async () => {
    const fields = `id scope scopeRef kind body source sourceRef occurredAt createdAt compressedAt`;
    const append = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { ${fields} } }`;
    for (const input of [event({ occurredAt: "2026-01-02T03:04:05.678Z" }), event({ sourceRef: "own-fields-1" })]) {
      const { data, errors } = await engram.gql(append, { input }, engram.tenant.writer);
      expect(errors).toBeUndefined();
      const read = await engram.gql(`query($id: ID!) { event(id: $id) { ${fields} } }`, { id: data.appendEvent.id }, engram.tenant.reader);
      expect(data.appendEvent).toEqual(read.data.event);
    }
  });

  it("appends an event and reads it back", async () => {
    const { data, errors } = await engram.gql(APPEND, { input: event({ sourceRef: "call-1" }) }, engram.tenant.writer);
    expect(errors).toBeUndefined();
    expect(data.appendEvent).toMatchObject({ kind: "decision", sourceRef: "call-1", compressedAt: null });
    const read = await engram.gql(`query($id: ID!) { event(id: $id) { id body } }`, { id: data.appendEvent.id }, engram.tenant.reader);
    expect(read.data.event.body).toContain("ROAS");
  });

  it("is idempotent on source + sourceRef: a retry returns the first event and creates nothing", async () => {
    const first = await engram.gql(APPEND, { input: event({ sourceRef: "retry-1" }) });
    const retries = await Promise.all(
      Array.from({ length: 5 }, () => engram.gql(APPEND, { input: event({ sourceRef: "retry-1", body: "changed" }) })),
    );
    for (const retry of retries) expect(retry.data.appendEvent.id).toBe(first.data.appendEvent.id);
    const count = await engram.services.db.memoryEvent.count({ where: { sourceRef: "retry-1" } });
    expect(count).toBe(1);
  });

  it("rejects bad input with BAD_USER_INPUT and writes nothing", async () => {
    const before = await engram.services.db.memoryEvent.count();
    const bad = await engram.gql(APPEND, { input: event({ kind: "  ", body: "x".repeat(70_000) }) });
    expect(bad.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(bad.errors?.[0].message).toMatch(/kind/);
    expect(await engram.services.db.memoryEvent.count()).toBe(before);
  });

  it("refuses a moment more than a day ahead, which would escape compaction and retention, and so does recordTurn", async () => {
    const ahead = new Date(Date.now() + 2 * 86_400_000).toISOString();
    const before = await engram.services.db.memoryEvent.count();
    const bad = await engram.gql(APPEND, { input: event({ sourceRef: "ahead-1", occurredAt: ahead }) });
    expect(bad.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(bad.errors?.[0].message).toMatch(/occurredAt: is in the future/);
    expect(await engram.services.db.memoryEvent.count()).toBe(before);
    const turn = await engram.gql(
      `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { firstSeq } }`,
      { input: { agentExternalId: "a", endUserExternalId: "u", conversationExternalId: "ahead", clientTurnId: "t1", userMessage: "hi", occurredAt: ahead } },
    );
    expect(turn.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(turn.errors?.[0].message).toMatch(/occurredAt: is in the future/);
    // Within a day of clock skew is taken.
    const skewed = new Date(Date.now() + 3_600_000).toISOString();
    const ok = await engram.gql(APPEND, { input: event({ sourceRef: "ahead-2", occurredAt: skewed }) });
    expect(ok.errors).toBeUndefined();
  });

  it("sends appends that arrive together as one insert, and a row the store refuses fails alone", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const deps = { pubsub: engram.services.pubsub };
    const append = (overrides: Partial<Pick<AppendEventInput, "body" | "sourceRef">>) => appendEvent(db, deps, { ...event(overrides), occurredAt: null });
    const inserts = (spy: { mock: { calls: unknown[][] } }) =>
      spy.mock.calls.filter(([q]) => /^\s*INSERT INTO "MemoryEvent"/.test(typeof q === "string" ? q : (q as { text: string }).text)).length;
    const spy = vi.spyOn(pg.Client.prototype, "query");
    let together;
    try {
      // The first goes at once; the six that arrive while it is out go as the second statement,
      // two of them with a sourceRef of the first batch and two with one already in their own.
      together = await Promise.all([
        append({ sourceRef: "together-0" }),
        ...["together-0", "together-1", "together-1", "together-2", "together-2"].map((sourceRef, i) =>
          append({ sourceRef, body: `body ${i}` }),
        ),
        append({ body: "no sourceRef" }),
      ]);
      expect(inserts(spy)).toBe(2);
    } finally {
      spy.mockRestore();
    }
    expect(together.map((a) => a.created)).toEqual([true, false, true, false, true, false, true]);
    expect(together[1].event.id).toBe(together[0].event.id);
    expect(together[3].event.id).toBe(together[2].event.id);
    expect(together[3].event.body).toBe("body 1");
    expect(together[5].event.id).toBe(together[4].event.id);
    expect(new Set(together.map((a) => a.event.id)).size).toBe(4);
    expect(await engram.services.db.memoryEvent.count({ where: { sourceRef: { startsWith: "together-" } } })).toBe(3);

    // A NUL (refused at the API's edge, not by the domain's schema) fails the store's insert: the
    // batch it came in is sent again row by row, so only that append fails.
    const mixed = await Promise.allSettled(
      ["first alone", "bad \u0000 body", "good one", "good two"].map((body) => append({ body, sourceRef: `mixed-${body}` })),
    );
    expect(mixed.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled", "fulfilled"]);
    const stored = await engram.services.db.memoryEvent.findMany({ where: { sourceRef: { startsWith: "mixed-" } }, select: { body: true } });
    expect(stored.map((e) => e.body).sort()).toEqual(["first alone", "good one", "good two"]);
  });

  it("keeps events immutable: there is no update mutation", async () => {
    const result = await engram.gql(`mutation { updateEvent(id: "x") { id } }`);
    expect(result.errors?.[0].message).toMatch(/Cannot query field "updateEvent"/);
  });

  it("lists events newest first with filters and cursor pagination", async () => {
    for (let day = 1; day <= 5; day++) {
      await engram.gql(APPEND, {
        input: event({ scopeRef: "paged", kind: day % 2 ? "call_summary" : "decision", occurredAt: `2026-01-0${day}T10:00:00Z` }),
      });
    }
    const LIST = `query($after: String, $kind: String) {
      events(scope: PROJECT, scopeRef: "paged", kind: $kind, first: 2, after: $after) {
        edges { cursor node { occurredAt kind } } pageInfo { hasNextPage endCursor }
      }
    }`;
    const page1 = await engram.gql(LIST, {}, engram.tenant.reader);
    expect(page1.data.events.edges.map((e: any) => e.node.occurredAt)).toEqual([
      "2026-01-05T10:00:00.000Z",
      "2026-01-04T10:00:00.000Z",
    ]);
    const page2 = await engram.gql(LIST, { after: page1.data.events.pageInfo.endCursor });
    expect(page2.data.events.edges[0].node.occurredAt).toBe("2026-01-03T10:00:00.000Z");
    const decisions = await engram.gql(LIST, { kind: "decision" });
    expect(decisions.data.events.edges.every((e: any) => e.node.kind === "decision")).toBe(true);
  });
});

// The server on a port, started once for the file (a second listen() throws).
let listening: Promise<string> | undefined;
const serverUrl = () => (listening ??= engram.listen());

describe("access", () => {
  it("refuses requests without a valid key, GraphiQL queries included", async () => {
    for (const key of [null, "egm_not-a-real-key", "Basic abc"]) {
      const result = await engram.gql(`{ viewer { role } }`, {}, key);
      expect(result.errors?.[0].extensions?.code).toBe("UNAUTHENTICATED");
      expect(result.data ?? null).toBeNull();
    }
  });

  it("checks the key before it reads the document: without one, a broken or unknown query says nothing of the schema", async () => {
    for (const query of [`{ nope }`, `{ viewer { `, `{ ${"a ".repeat(50_000)}}`]) {
      const result = await engram.gql(query, {}, null);
      expect(result.errors?.map((e: { extensions?: { code?: string } }) => e.extensions?.code)).toEqual(["UNAUTHENTICATED"]);
      expect(JSON.stringify(result.errors)).not.toMatch(/nope|Syntax|Query/);
    }
    // Nor on the other paths yoga takes as its endpoint.
    const url = await serverUrl();
    for (const path of ["/graphql/", "/x/graphql", "/?a=/graphql"]) {
      const response = await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ query: "{ nope }" }) });
      expect(response.status, path).toBe(401);
      expect(await response.text(), path).not.toMatch(/nope/);
    }
  });

  it("lets a reader read but not write, and only an admin make keys", async () => {
    const denied = await engram.gql(APPEND, { input: event() }, engram.tenant.reader);
    expect(denied.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    const writerKey = await engram.gql(`mutation { createApiKey(role: READER) { key } }`, {}, engram.tenant.writer);
    expect(writerKey.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    const adminKey = await engram.gql(`mutation { createApiKey(role: READER) { key role } }`, {}, engram.tenant.admin);
    expect(adminKey.data.createApiKey.role).toBe("READER");
    // One asked for without its key would be live and lost: refused, and none is made.
    const keysBefore = await engram.services.db.apiKey.count();
    const blind = await engram.gql(`mutation { createApiKey(role: READER) { id role } }`, {}, engram.tenant.admin);
    expect(blind.errors?.[0]).toMatchObject({ extensions: { code: "BAD_USER_INPUT" }, message: expect.stringMatching(/Select `key`/) });
    expect(await engram.services.db.apiKey.count()).toBe(keysBefore);
    const viaFragment = await engram.gql(`mutation { createApiKey(role: READER) { ...k } } fragment k on CreatedApiKey { key }`, {}, engram.tenant.admin);
    expect(viaFragment.errors).toBeUndefined();
    // Asked for, but skipped: as good as not asked for.
    for (const [query, variables] of [
      [`mutation { createApiKey(role: READER) { id key @include(if: false) } }`, {}],
      [`mutation($s: Boolean!) { createApiKey(role: READER) { id key @skip(if: $s) } }`, { s: true }],
    ] as const) {
      const skipped = await engram.gql(query, variables, engram.tenant.admin);
      expect(skipped.errors?.[0].extensions?.code, query).toBe("BAD_USER_INPUT");
    }
    expect(await engram.services.db.apiKey.count()).toBe(keysBefore + 1);
    const viewer = await engram.gql(`{ viewer { role } }`, {}, adminKey.data.createApiKey.key);
    expect(viewer.data.viewer.role).toBe("READER");
  });

  it("serves GraphiQL from the endpoint with everything bundled (nothing loaded from a CDN)", async () => {
    const response = await engram.app.yoga.fetch("http://engram.test/graphql", { headers: { accept: "text/html" } });
    expect(response.status).toBe(200);
    const html = await response.text();
    expect(html).toContain("<title>Engram</title>");
    expect(html).not.toMatch(/<script[^>]+src="https?:|<link[^>]+href="https?:\/\/(?!raw)/);
    expect(html).not.toContain("unpkg.com");
  });

  it("stores keys hashed, never in the clear", async () => {
    const rows = await engram.services.db.apiKey.findMany();
    for (const row of rows) {
      expect(row.hash).toMatch(/^[0-9a-f]{64}$/);
      expect(row.hash).not.toContain(engram.tenant.admin);
    }
  });
});

describe("subscriptions", () => {

  it("delivers an appended event to a graphql-ws subscriber, filtered by scope", async () => {
    const url = await serverUrl();
    const client = wsClient(url, engram.tenant.reader);
    const sub = collect(client, `subscription { eventAppended(scope: ENTITY, scopeRef: "acme") { id body scopeRef } }`);
    await settle();
    await engram.gql(APPEND, { input: event({ scope: "PROJECT", scopeRef: "other", body: "not for you" }) });
    await engram.gql(APPEND, { input: event({ scope: "ENTITY", scopeRef: "acme", body: "Acme renewed" }) });
    const first = await sub.next(1);
    expect(first.data?.eventAppended).toMatchObject({ scopeRef: "acme", body: "Acme renewed" });
    expect(sub.received).toHaveLength(1);
    sub.dispose();
    await client.dispose();
  });

  it("a live feed item and its history row are one item: the same id and time", async () => {
    const url = await serverUrl();
    const client = wsClient(url, engram.tenant.reader);
    const sub = collect(client, `subscription { memoryFeed { id at ... on EventFeedItem { event { id } } } }`);
    await settle();
    await engram.gql(APPEND, { input: event({ scopeRef: "feed-time", body: "live and history" }) });
    await sub.next(1);
    const live = sub.received[0].data.memoryFeed;
    const history = await engram.gql(`{ memoryFeed(first: 5, kinds: [EVENT]) { items { id at ... on EventFeedItem { event { id } } } } }`, {}, engram.tenant.reader);
    expect(history.data.memoryFeed.items.find((i: { id: string }) => i.id === live.id)).toEqual(live);
    sub.dispose();
    await client.dispose();
  });

  it("never delivers another tenant's events", async () => {
    const url = await engram.listen().catch(() => null);
    void url;
  });
});

describe("insertRows (the feed's history and the usage rows)", () => {
  it("writes any number of a tenant's rows in one statement: absent columns NULL, JSON and times as given", async () => {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const at = new Date("2026-03-04T05:06:07.089Z");
    const detail = { chosenBy: "FLOOR", degraded: null, candidates: [{ snippetId: "s-1", score: 0.5, note: `quote " and \\ and é` }] };
    const rows = [
      { id: randomUUID(), kind: "RECALL", refId: "r-1", endUserId: "u-1", detail, at },
      { id: randomUUID(), kind: "EVENT", refId: "e-1", scope: "PROJECT", scopeRef: "p-1", at },
      // A tenant id passed in a row is replaced by the client's own.
      { id: randomUUID(), kind: "JOB_RUN", at, tenantId: engram.other.tenantId },
    ];
    const columns = { id: "text", kind: "text", refId: "text", change: "text", endUserId: "text", scope: "text", scopeRef: "text", detail: "jsonb", at: "timestamp(3)" } as const;
    const spy = vi.spyOn(pg.Client.prototype, "query");
    try {
      await insertRows(db, "ActivityLog", columns, rows);
      // Its own connection's statements only (no BEGIN or COMMIT around the insert): the process's
      // other connections (the store's and the queue's background work) may send theirs meanwhile.
      const sql = (args: unknown[]) => (typeof args[0] === "string" ? args[0] : String((args[0] as { text?: string })?.text ?? ""));
      const inserts = spy.mock.calls.flatMap((args, i) => (sql(args).includes('INSERT INTO "ActivityLog"') ? [spy.mock.contexts[i]] : []));
      expect(inserts).toHaveLength(1);
      expect(spy.mock.contexts.filter((client) => client === inserts[0])).toHaveLength(1);
    } finally {
      spy.mockRestore();
    }
    const ids = rows.map((row) => row.id);
    const stored = await engram.services.db.activityLog.findMany({ where: { id: { in: ids } } });
    expect(stored).toHaveLength(3);
    for (const row of rows) {
      const found = stored.find((s) => s.id === row.id)!;
      expect(found).toMatchObject({ ...row, tenantId: engram.tenant.tenantId, change: null, agentId: null, conversationId: null });
      expect(found.at.toISOString()).toBe(at.toISOString());
    }
    // A database NULL, not JSON null, where a row has no detail.
    const nulls = await engram.services.db.$queryRaw<{ id: string }[]>`SELECT "id" FROM "ActivityLog" WHERE "id" = ANY(${ids}) AND "detail" IS NULL`;
    expect(nulls.map((row) => row.id).sort()).toEqual(ids.slice(1).sort());
    await expect(insertRows(db, "ActivityLog", columns, [])).resolves.toBeUndefined();
    await expect(insertRows(db, "ActivityLog", { 'id" text); DROP TABLE "ActivityLog"; --': "text" }, rows)).rejects.toThrow(/not a column name/);
  });
});

describe("the feed's history, a page at a time", () => {
  const PAGE = `query($first: Int, $after: String, $kinds: [FeedKind!]) {
    memoryFeed(first: $first, after: $after, kinds: $kinds) { items { id ... on JobRunFeedItem { run { name status } } } endCursor hasMore } }`;

  it("goes on past a page's last item once it is gone: a job run that finished since, a row deleted", async () => {
    const tenant = await createTenantWithKeys(engram.services, "feed-paging");
    const db = forTenant(engram.services.db, tenant.tenantId);
    const { pubsub } = engram.services.deps;
    const succeeds = async () => ({ status: "SUCCEEDED" as const, result: {} });
    await recordJobRun(db, pubsub, "first", succeeds);
    let finish = () => {};
    let running!: Promise<unknown>;
    await new Promise<void>((started) => {
      running = recordJobRun(db, pubsub, "second", () => {
        started();
        return new Promise((done) => (finish = () => done({ status: "SUCCEEDED", result: {} })));
      });
    });
    await recordJobRun(db, pubsub, "third", succeeds);
    await pubsub.settled();

    const page1 = await engram.gql(PAGE, { first: 2, kinds: ["JOB_RUN"] }, tenant.reader);
    expect(page1.errors).toBeUndefined();
    expect(page1.data.memoryFeed.items.map((i: { run: { name: string } }) => i.run)).toEqual([
      { name: "third", status: "SUCCEEDED" },
      { name: "second", status: "RUNNING" },
    ]);
    expect(page1.data.memoryFeed.hasMore).toBe(true);

    // The run's row is replaced by a newer one as it finishes: the page's last row is gone.
    finish();
    await running;
    await pubsub.settled();
    const page2 = await engram.gql(PAGE, { first: 2, kinds: ["JOB_RUN"], after: page1.data.memoryFeed.endCursor }, tenant.reader);
    expect(page2.errors).toBeUndefined();
    expect(page2.data.memoryFeed.items.map((i: { run: { name: string } }) => i.run.name)).toEqual(["first"]);
    expect(page2.data.memoryFeed.hasMore).toBe(false);
  });

  it("keeps its order through items announced in the same millisecond, each once, with rows deleted between pages", async () => {
    const tenant = await createTenantWithKeys(engram.services, "feed-ties");
    const db = forTenant(engram.services.db, tenant.tenantId);
    // Two processes (a server and a CLI run) can announce in the same millisecond.
    const at = new Date("2026-05-06T07:08:09.010Z");
    const ids = ["tie-5", "tie-4", "tie-3", "tie-2", "tie-1"];
    const columns = { id: "text", kind: "text", refId: "text", change: "text", scope: "text", scopeRef: "text", at: "timestamp(3)" } as const;
    await insertRows(db, "ActivityLog", columns, ids.map((id) => ({ id, kind: "ENTRY", refId: `entry-${id}`, change: "CREATED", scope: "PROJECT", scopeRef: "ties", at })));

    type Page = { memoryFeed: { items: { id: string }[]; endCursor: string | null; hasMore: boolean } };
    const seen: string[] = [];
    let after: string | null = null;
    for (let pages = 0; pages < 5; pages++) {
      const { data, errors }: GraphQLResult<Page> = await engram.gql(PAGE, { first: 2, kinds: ["ENTRY"], after }, tenant.reader);
      expect(errors).toBeUndefined();
      seen.push(...data.memoryFeed.items.map((i) => i.id));
      if (!data.memoryFeed.hasMore) break;
      after = data.memoryFeed.endCursor;
      await db.activityLog.deleteMany({ where: { id: seen.at(-1) } });
    }
    expect(seen).toEqual(ids);
  });

  it("refuses a cursor it did not give, with BAD_USER_INPUT", async () => {
    const notOurs = ["garbage", randomUUID(), Buffer.from(JSON.stringify({ at: 1 })).toString("base64url"), ""];
    for (const after of notOurs) {
      const { data, errors } = await engram.gql(PAGE, { first: 2, after }, engram.tenant.reader);
      expect(data).toBeNull();
      expect(errors?.[0].extensions?.code, after).toBe("BAD_USER_INPUT");
    }
  });
});
