import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { sseSubscribe } from "./helpers/sse.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

const ENTRY_FIELDS = "id scope scopeRef title summary tags importance source createdAt updatedAt";

const CREATE = /* GraphQL */ `
  mutation Create($input: CreateEntryInput!) { createEntry(input: $input) { ${ENTRY_FIELDS} } }
`;
const CORRECT = /* GraphQL */ `
  mutation Correct($id: ID!, $input: CorrectEntryInput!) { correctEntry(id: $id, input: $input) { ${ENTRY_FIELDS} } }
`;
const FORGET = /* GraphQL */ `
  mutation Forget($id: ID!) { forgetEntry(id: $id) { change entryId scope scopeRef entry { id } } }
`;
const ENTRY = /* GraphQL */ `query Entry($id: ID!) { entry(id: $id) { ${ENTRY_FIELDS} } }`;
const ENTRIES = /* GraphQL */ `
  query Entries($scope: Scope, $scopeRef: String, $tags: [String!], $search: String, $first: Int, $after: String) {
    entries(scope: $scope, scopeRef: $scopeRef, tags: $tags, search: $search, first: $first, after: $after) {
      edges { cursor node { id title tags importance } }
      pageInfo { hasNextPage endCursor }
    }
  }
`;

const entry = (overrides: Record<string, unknown> = {}) => ({
  scope: "ENTITY",
  scopeRef: "acme",
  title: "Acme prefers quarterly reviews",
  summary: "Their CFO asked for a **quarterly** cadence.",
  ...overrides,
});

let engram: TestEngram;
let listening: Promise<string> | undefined;
/** The server listens once per file; later calls reuse its URL. */
const serverUrl = () => (listening ??= engram.listen());

beforeAll(async () => {
  engram = await startTestEngram();
});
afterAll(() => engram?.stop());

async function create(overrides: Record<string, unknown> = {}) {
  const result = await engram.gql(CREATE, { input: entry(overrides) }, engram.tenant.writer);
  expect(result.errors).toBeUndefined();
  return result.data.createEntry as { id: string; title: string; updatedAt: string } & Record<string, any>;
}

async function list(vars: Record<string, unknown>) {
  const result = await engram.gql(ENTRIES, vars, engram.tenant.reader);
  expect(result.errors).toBeUndefined();
  return result.data.entries as {
    edges: { cursor: string; node: { id: string; title: string; tags: string[]; importance: number } }[];
    pageInfo: { hasNextPage: boolean; endCursor: string | null };
  };
}

const titles = (connection: Awaited<ReturnType<typeof list>>) => connection.edges.map((e) => e.node.title);

describe("createEntry and entry(id)", () => {
  it("creates an entry with defaults and reads it back", async () => {
    const created = await create({ scopeRef: "create-1", tags: ["billing", "billing", "cfo"] });
    expect(created).toMatchObject({
      scope: "ENTITY",
      scopeRef: "create-1",
      title: "Acme prefers quarterly reviews",
      importance: 3,
      source: "MANUAL",
      tags: ["billing", "cfo"],
    });
    const read = await engram.gql(ENTRY, { id: created.id }, engram.tenant.reader);
    expect(read.errors).toBeUndefined();
    expect(read.data.entry).toEqual(created);
  });

  it("keeps the given importance and source", async () => {
    const created = await create({ scopeRef: "create-2", importance: 5, source: "CALL" });
    expect(created).toMatchObject({ importance: 5, source: "CALL" });
  });

  it("answers NOT_FOUND for an unknown id", async () => {
    const read = await engram.gql(ENTRY, { id: "00000000-0000-0000-0000-000000000000" }, engram.tenant.reader);
    expect(read.errors?.[0].extensions?.code).toBe("NOT_FOUND");
    expect(read.data ?? null).toBeNull();
  });

  it("does not let a reader write", async () => {
    const before = await engram.services.db.memoryEntry.count();
    const denied = await engram.gql(CREATE, { input: entry() }, engram.tenant.reader);
    expect(denied.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    expect(await engram.services.db.memoryEntry.count()).toBe(before);
  });
});

describe("validation", () => {
  const invalid: [string, Record<string, unknown>, RegExp][] = [
    ["importance 0", { importance: 0 }, /importance/],
    ["importance 6", { importance: 6 }, /importance/],
    ["an empty title", { title: "" }, /title/],
    ["a blank title", { title: "   " }, /title/],
    ["a multi-line title", { title: "first line\nsecond line" }, /title/],
    ["a title over 200 characters", { title: "t".repeat(201) }, /title/],
    ["more than 32 tags", { tags: Array.from({ length: 33 }, (_, i) => `tag-${i}`) }, /tags/],
    ["a tag over 64 characters", { tags: ["ok", "x".repeat(65)] }, /tags/],
    ["an empty summary", { summary: "" }, /summary/],
    ["a summary over 32,000 characters", { summary: "s".repeat(32_001) }, /summary/],
    ["a scopeRef over 200 characters", { scopeRef: "r".repeat(201) }, /scopeRef/],
  ];

  it.each(invalid)("rejects %s on create with BAD_USER_INPUT and writes nothing", async (_name, overrides, field) => {
    const before = await engram.services.db.memoryEntry.count();
    const result = await engram.gql(CREATE, { input: entry(overrides) }, engram.tenant.writer);
    expect(result.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(result.errors?.[0].message).toMatch(field);
    expect(result.data ?? null).toBeNull();
    expect(await engram.services.db.memoryEntry.count()).toBe(before);
  });

  it("accepts the limits themselves", async () => {
    const created = await create({
      scopeRef: "limits",
      title: "t".repeat(200),
      summary: "s".repeat(32_000),
      tags: Array.from({ length: 32 }, (_, i) => `${i}`.padEnd(64, "x")),
      importance: 1,
    });
    expect(created.title).toHaveLength(200);
    expect(created.tags).toHaveLength(32);
  });

  it.each(invalid.filter(([, o]) => !("scopeRef" in o)))(
    "rejects %s on correct with BAD_USER_INPUT and changes nothing",
    async (_name, overrides) => {
      const original = await create({ scopeRef: "bad-correction" });
      const result = await engram.gql(CORRECT, { id: original.id, input: overrides }, engram.tenant.writer);
      expect(result.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
      const row = await engram.services.db.memoryEntry.findUniqueOrThrow({ where: { id: original.id } });
      expect(row).toMatchObject({ title: original.title, summary: original.summary, importance: 3, tags: [] });
      expect(row.updatedAt.toISOString()).toBe(original.updatedAt);
    },
  );
});

describe("correctEntry", () => {
  it("changes only the fields given", async () => {
    const original = await create({ scopeRef: "correct-1", tags: ["a"], importance: 2 });
    const titleOnly = await engram.gql(CORRECT, { id: original.id, input: { title: "Acme prefers monthly reviews" } }, engram.tenant.writer);
    expect(titleOnly.errors).toBeUndefined();
    expect(titleOnly.data.correctEntry).toMatchObject({
      id: original.id,
      title: "Acme prefers monthly reviews",
      summary: original.summary,
      tags: ["a"],
      importance: 2,
      scope: "ENTITY",
      scopeRef: "correct-1",
      createdAt: original.createdAt,
    });

    const rest = await engram.gql(
      CORRECT,
      { id: original.id, input: { summary: "Monthly now.", tags: ["b", "c"], importance: 4, title: null } },
      engram.tenant.writer,
    );
    expect(rest.errors).toBeUndefined();
    expect(rest.data.correctEntry).toMatchObject({
      title: "Acme prefers monthly reviews",
      summary: "Monthly now.",
      tags: ["b", "c"],
      importance: 4,
    });
    const read = await engram.gql(ENTRY, { id: original.id }, engram.tenant.reader);
    expect(read.data.entry).toEqual(rest.data.correctEntry);
  });

  it("can clear the tags with an empty list", async () => {
    const original = await create({ scopeRef: "correct-2", tags: ["a", "b"] });
    const cleared = await engram.gql(CORRECT, { id: original.id, input: { tags: [] } }, engram.tenant.writer);
    expect(cleared.data.correctEntry.tags).toEqual([]);
  });

  it("answers NOT_FOUND for an unknown id and creates nothing", async () => {
    const before = await engram.services.db.memoryEntry.count();
    const result = await engram.gql(CORRECT, { id: "missing", input: { title: "x" } }, engram.tenant.writer);
    expect(result.errors?.[0].extensions?.code).toBe("NOT_FOUND");
    expect(await engram.services.db.memoryEntry.count()).toBe(before);
  });
});

describe("forgetEntry", () => {
  it("deletes the entry for good; its events stay, unlinked", async () => {
    const doomed = await create({ scopeRef: "forget-1" });
    const appended = await engram.gql(
      `mutation { appendEvent(input: { scope: ENTITY, scopeRef: "forget-1", kind: "note", body: "b", source: "s" }) { id } }`,
      {},
      engram.tenant.writer,
    );
    const eventId = appended.data.appendEvent.id;
    // Only the compactor folds events into entries; do its part directly.
    await engram.services.db.memoryEvent.update({ where: { id: eventId }, data: { entryId: doomed.id, compressedAt: new Date() } });

    const forgotten = await engram.gql(FORGET, { id: doomed.id }, engram.tenant.writer);
    expect(forgotten.errors).toBeUndefined();
    expect(forgotten.data.forgetEntry).toEqual({
      change: "FORGOTTEN",
      entryId: doomed.id,
      scope: "ENTITY",
      scopeRef: "forget-1",
      entry: null,
    });

    const read = await engram.gql(ENTRY, { id: doomed.id }, engram.tenant.reader);
    expect(read.errors?.[0].extensions?.code).toBe("NOT_FOUND");
    expect(titles(await list({ scopeRef: "forget-1" }))).toEqual([]);
    const again = await engram.gql(FORGET, { id: doomed.id }, engram.tenant.writer);
    expect(again.errors?.[0].extensions?.code).toBe("NOT_FOUND");

    const event = await engram.gql(`query($id: ID!) { event(id: $id) { id entry { id } } }`, { id: eventId }, engram.tenant.reader);
    expect(event.data.event).toEqual({ id: eventId, entry: null });
  });

  it("is refused to a reader and leaves the entry in place", async () => {
    const kept = await create({ scopeRef: "forget-2" });
    const denied = await engram.gql(FORGET, { id: kept.id }, engram.tenant.reader);
    expect(denied.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    expect(await engram.services.db.memoryEntry.findUnique({ where: { id: kept.id } })).not.toBeNull();
  });
});

describe("entries", () => {
  it("lists most recently updated first, filtered by scope and scopeRef", async () => {
    const first = await create({ scopeRef: "listing", title: "first" });
    await create({ scopeRef: "listing", title: "second" });
    await create({ scope: "PROJECT", scopeRef: "listing", title: "a project entry" });
    await create({ scopeRef: "elsewhere", title: "elsewhere" });
    // Correcting an entry makes it the most recently updated.
    await engram.gql(CORRECT, { id: first.id, input: { importance: 4 } }, engram.tenant.writer);

    expect(titles(await list({ scope: "ENTITY", scopeRef: "listing" }))).toEqual(["first", "second"]);
    expect(titles(await list({ scope: "PROJECT", scopeRef: "listing" }))).toEqual(["a project entry"]);
    expect(new Set(titles(await list({ scopeRef: "listing" })))).toEqual(new Set(["first", "second", "a project entry"]));
  });

  it("filters by tags: every tag asked for must be on the entry", async () => {
    await create({ scopeRef: "tagged", title: "both", tags: ["billing", "cfo", "q3"] });
    await create({ scopeRef: "tagged", title: "billing only", tags: ["billing"] });
    await create({ scopeRef: "tagged", title: "cfo only", tags: ["cfo"] });
    await create({ scopeRef: "tagged", title: "none" });

    expect(titles(await list({ scopeRef: "tagged", tags: ["billing", "cfo"] }))).toEqual(["both"]);
    expect(new Set(titles(await list({ scopeRef: "tagged", tags: ["billing"] })))).toEqual(new Set(["both", "billing only"]));
    expect(titles(await list({ scopeRef: "tagged", tags: ["billing", "missing"] }))).toEqual([]);
    expect(titles(await list({ scopeRef: "tagged", tags: [] }))).toHaveLength(4);
  });

  it("pages with cursors: every entry once, in order, and the last page says so", async () => {
    for (let i = 1; i <= 7; i++) await create({ scopeRef: "paged", title: `paged ${i}` });
    const all = titles(await list({ scopeRef: "paged", first: 50 }));
    expect(all).toHaveLength(7);

    const seen: string[] = [];
    let after: string | null = null;
    let pages = 0;
    for (;;) {
      const page = await list({ scopeRef: "paged", first: 3, after });
      seen.push(...titles(page));
      pages++;
      if (!page.pageInfo.hasNextPage) break;
      after = page.pageInfo.endCursor;
    }
    expect(pages).toBe(3);
    expect(seen).toEqual(all);
  });

  it("rejects an oversize tag filter with BAD_USER_INPUT", async () => {
    const result = await engram.gql(ENTRIES, { tags: ["x".repeat(65)] }, engram.tenant.reader);
    expect(result.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
  });
});

describe("entries(search)", () => {
  it("finds the word in the title or the summary, and nothing else", async () => {
    await create({ scopeRef: "search-1", title: "ROAS target cut to 3", summary: "Decided on the call." });
    await create({ scopeRef: "search-1", title: "Campaign review", summary: "Our roas dropped after the **launch**." });
    await create({ scopeRef: "search-1", title: "Unrelated", summary: "Nothing about ad spend returns here." });

    const found = titles(await list({ scopeRef: "search-1", search: "ROAS" }));
    expect(new Set(found)).toEqual(new Set(["ROAS target cut to 3", "Campaign review"]));
    expect(titles(await list({ scopeRef: "search-1", search: "launched" }))).toEqual(["Campaign review"]);
    expect(titles(await list({ scopeRef: "search-1", search: "blockchain" }))).toEqual([]);
  });

  it("ranks a title match above a summary-only match, even when the latter is newer and more important", async () => {
    await create({ scopeRef: "search-2", title: "ROAS is the metric that matters", summary: "Agreed with finance.", importance: 1 });
    await create({ scopeRef: "search-2", title: "Quarterly notes", summary: "We talked about ROAS briefly.", importance: 5 });
    expect(titles(await list({ scopeRef: "search-2", search: "ROAS" }))).toEqual([
      "ROAS is the metric that matters",
      "Quarterly notes",
    ]);
  });

  it("nudges equally relevant entries by importance, even when the less important is newer", async () => {
    await create({ scopeRef: "search-3", title: "Critical ROAS floor", summary: "Same words.", importance: 5 });
    await create({ scopeRef: "search-3", title: "Trivial ROAS floor", summary: "Same words.", importance: 1 });
    await create({ scopeRef: "search-3", title: "Middling ROAS floor", summary: "Same words.", importance: 3 });
    expect(titles(await list({ scopeRef: "search-3", search: "ROAS floor" }))).toEqual([
      "Critical ROAS floor",
      "Middling ROAS floor",
      "Trivial ROAS floor",
    ]);
  });

  it("combines search with scope and tag filters, and pages the ranked results", async () => {
    for (let importance = 1; importance <= 5; importance++) {
      await create({ scopeRef: "search-4", title: `Spend ${importance}`, summary: "budget pacing", importance, tags: ["ads"] });
    }
    await create({ scopeRef: "search-4", title: "Untagged spend", summary: "budget pacing", importance: 5 });
    await create({ scope: "TEAM", scopeRef: "search-4", title: "Team spend", summary: "budget pacing", importance: 5, tags: ["ads"] });

    const ranked = titles(await list({ scope: "ENTITY", scopeRef: "search-4", tags: ["ads"], search: "budget", first: 50 }));
    expect(ranked).toEqual(["Spend 5", "Spend 4", "Spend 3", "Spend 2", "Spend 1"]);

    const page1 = await list({ scope: "ENTITY", scopeRef: "search-4", tags: ["ads"], search: "budget", first: 2 });
    expect(titles(page1)).toEqual(["Spend 5", "Spend 4"]);
    expect(page1.pageInfo.hasNextPage).toBe(true);
    const page2 = await list({ scope: "ENTITY", scopeRef: "search-4", tags: ["ads"], search: "budget", first: 2, after: page1.pageInfo.endCursor });
    expect(titles(page2)).toEqual(["Spend 3", "Spend 2"]);
    const page3 = await list({ scope: "ENTITY", scopeRef: "search-4", tags: ["ads"], search: "budget", first: 2, after: page2.pageInfo.endCursor });
    expect(titles(page3)).toEqual(["Spend 1"]);
    expect(page3.pageInfo.hasNextPage).toBe(false);
  });

  it("finds a corrected entry by its new words, not its old ones", async () => {
    const original = await create({ scopeRef: "search-5", title: "Churn risk", summary: "Watch the renewal." });
    await engram.gql(CORRECT, { id: original.id, input: { summary: "Expansion likely." } }, engram.tenant.writer);
    expect(titles(await list({ scopeRef: "search-5", search: "renewal" }))).toEqual([]);
    expect(titles(await list({ scopeRef: "search-5", search: "expansion" }))).toEqual(["Churn risk"]);
  });

  it("treats a blank search as no search", async () => {
    await create({ scopeRef: "search-6", title: "Anything" });
    expect(titles(await list({ scopeRef: "search-6", search: "   " }))).toEqual(["Anything"]);
  });

  it("takes search syntax as text, never as SQL", async () => {
    await create({ scopeRef: "search-7", title: "O'Brien's ROAS", summary: "quoted" });
    const result = await engram.gql(ENTRIES, { scopeRef: "search-7", search: `'); DROP TABLE "MemoryEntry"; --` }, engram.tenant.reader);
    expect(result.errors).toBeUndefined();
    expect(titles(await list({ scopeRef: "search-7", search: `"O'Brien's" OR roas` }))).toEqual(["O'Brien's ROAS"]);
  });
});

describe("entryChanged over graphql-ws", () => {
  it("announces no CORRECTED for a correction that changes nothing, and keeps its updatedAt", async () => {
    const client = wsClient(await serverUrl(), engram.tenant.reader);
    const sub = collect(client, `subscription { entryChanged(scope: ENTITY, scopeRef: "same") { change entry { importance } } }`);
    await settle();
    const original = await create({ scopeRef: "same", tags: ["a"], importance: 2 });
    await sub.next(1);
    for (const input of [{}, { title: original.title, tags: ["a"] }, { importance: 2, summary: null }]) {
      const same = await engram.gql(CORRECT, { id: original.id, input }, engram.tenant.writer);
      expect(same.errors, JSON.stringify(input)).toBeUndefined();
      expect(same.data.correctEntry.updatedAt, JSON.stringify(input)).toBe(original.updatedAt);
    }
    const changed = await engram.gql(CORRECT, { id: original.id, input: { importance: 3 } }, engram.tenant.writer);
    expect(changed.data.correctEntry.updatedAt).not.toBe(original.updatedAt);
    await sub.next(2);
    await settle();
    expect(sub.received.map((r) => r.data?.entryChanged)).toEqual([
      { change: "CREATED", entry: { importance: 2 } },
      { change: "CORRECTED", entry: { importance: 3 } },
    ]);
    sub.dispose();
    await client.dispose();
  });

  it("delivers CREATED, CORRECTED and FORGOTTEN for the scope asked for, with the entry as a query would see it", async () => {
    const url = await serverUrl();
    const client = wsClient(url, engram.tenant.reader);
    const sub = collect(
      client,
      `subscription($ref: String) { entryChanged(scope: ENTITY, scopeRef: $ref) { change entryId scope scopeRef entry { id title importance } } }`,
      { ref: "live" },
    );
    await settle();

    await create({ scope: "PROJECT", scopeRef: "live", title: "other scope" });
    await create({ scopeRef: "not-live", title: "other scopeRef" });
    const created = await create({ scopeRef: "live", title: "Live entry", importance: 2 });
    await sub.next(1);
    await engram.gql(CORRECT, { id: created.id, input: { importance: 5 } }, engram.tenant.writer);
    await sub.next(2);
    await engram.gql(FORGET, { id: created.id }, engram.tenant.writer);
    await sub.next(3);
    expect(sub.failure).toBeUndefined();
    const changes = sub.received.map((r) => r.data?.entryChanged);
    expect(changes).toEqual([
      { change: "CREATED", entryId: created.id, scope: "ENTITY", scopeRef: "live", entry: expect.objectContaining({ title: "Live entry" }) },
      { change: "CORRECTED", entryId: created.id, scope: "ENTITY", scopeRef: "live", entry: expect.objectContaining({ importance: 5 }) },
      { change: "FORGOTTEN", entryId: created.id, scope: "ENTITY", scopeRef: "live", entry: null },
    ]);
    expect(sub.received).toHaveLength(3);
    sub.dispose();
    await client.dispose();
  });

  it("delivers everything of the tenant without a filter", async () => {
    const url = await serverUrl();
    const client = wsClient(url, engram.tenant.reader);
    const sub = collect(client, `subscription { entryChanged { change scopeRef } }`);
    await settle();
    await create({ scope: "TEAM", scopeRef: "unfiltered-1" });
    await create({ scope: "INSTITUTIONAL", scopeRef: "unfiltered-2" });
    await sub.next(2);
    expect(sub.received.map((r) => r.data?.entryChanged)).toEqual([
      { change: "CREATED", scopeRef: "unfiltered-1" },
      { change: "CREATED", scopeRef: "unfiltered-2" },
    ]);
    sub.dispose();
    await client.dispose();
  });
});

describe("subscriptions over SSE", () => {
  it("streams eventAppended to a POST that accepts text/event-stream", async () => {
    const url = await serverUrl();
    const sub = await sseSubscribe(
      url,
      engram.tenant.reader,
      `subscription { eventAppended(scope: TEAM, scopeRef: "sse") { id kind body scopeRef } }`,
    );
    expect(sub.status).toBe(200);
    expect(sub.contentType).toMatch(/text\/event-stream/);
    await settle();

    await engram.gql(
      `mutation { appendEvent(input: { scope: TEAM, scopeRef: "elsewhere", kind: "note", body: "not this", source: "sse-test" }) { id } }`,
      {},
      engram.tenant.writer,
    );
    const appended = await engram.gql(
      `mutation { appendEvent(input: { scope: TEAM, scopeRef: "sse", kind: "standup", body: "Shipped the **SSE** path.", source: "sse-test" }) { id } }`,
      {},
      engram.tenant.writer,
    );
    const first = await sub.next(1);
    expect(first?.errors).toBeUndefined();
    expect(first?.data?.eventAppended).toEqual({
      id: appended.data.appendEvent.id,
      kind: "standup",
      body: "Shipped the **SSE** path.",
      scopeRef: "sse",
    });
    expect(sub.received).toHaveLength(1);
    sub.close();
  });
});

describe("shutdown with a subscription open over SSE", () => {
  it("closes the stream instead of waiting for it, so nothing is counted as cut off", async () => {
    const own = await startTestEngram();
    const warnings: string[] = [];
    const warn = own.services.log.warn.bind(own.services.log);
    own.services.log.warn = (message: string, fields?: object) => {
      warnings.push(message);
      warn(message, fields);
    };
    const url = await own.listen();
    const sub = await sseSubscribe(url, own.tenant.reader, `subscription { eventAppended(scope: TEAM, scopeRef: "bye") { id } }`);
    expect(sub.contentType).toMatch(/text\/event-stream/);
    await settle();
    await own.stop();
    // Before, the stream was not recognised as one: the stop waited the whole drain and said so.
    expect(warnings.filter((w) => /cut off/.test(w))).toEqual([]);
    sub.close();
  });
});
