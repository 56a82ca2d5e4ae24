import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { getIntrospectionQuery } from "graphql";
import { isUniqueViolation } from "../src/db.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { collect, wsClient } from "./helpers/ws.ts";

const APPEND = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`;
let n = 0;
const event = (over: Record<string, unknown>) => ({
  scope: "PROJECT", scopeRef: "typed", kind: "note", body: "hello", source: "test", sourceRef: `typed-${n++}`, ...over,
});
const literal = (body: string) =>
  `mutation { appendEvent(input: { scope: PROJECT, scopeRef: "typed", kind: "k", body: "${body}", source: "s", sourceRef: "lit-${n++}" }) { id } }`;

describe("every bad input answers with a code and a message, and writes nothing", () => {
  let engram: TestEngram;
  beforeAll(async () => {
    engram = await startTestEngram({ env: { ENGRAM_EMBEDDINGS: "offline" } });
  });
  afterAll(() => engram?.stop());

  // One HTTP server for the tests that need one (the REST paths, WebSockets).
  let listening: Promise<string> | undefined;
  const serverUrl = () => (listening ??= engram.listen());

  const expectCode = async (query: string, variables: Record<string, unknown> | undefined, code: string, message: RegExp) => {
    const { errors } = await engram.gql(query, variables);
    expect(errors?.[0]?.extensions?.code, `${query} ${JSON.stringify(variables)}`).toBe(code);
    expect(errors?.[0]?.message).toMatch(message);
  };

  it("NUL bytes, lone surrogates and out-of-range dates are BAD_USER_INPUT, in variables and literals", async () => {
    await expectCode(APPEND, { input: event({ body: "a\u0000b" }) }, "BAD_USER_INPUT", /variables\.input\.body holds a NUL/);
    await expectCode(APPEND, { input: event({ body: "a\ud800b" }) }, "BAD_USER_INPUT", /lone UTF-16 surrogate/);
    await expectCode(APPEND, { input: event({ tags: ["ok", "\udc00"] }) }, "BAD_USER_INPUT", /tags\[1\] holds a lone/);
    await expectCode(literal("a\\u0000b"), undefined, "BAD_USER_INPUT", /NUL/);
    await expectCode(literal("a\\ud800b"), undefined, "BAD_USER_INPUT", /Unicode escape/);
    for (const occurredAt of ["+275760-09-13T00:00:00.000Z", "99999-01-01T00:00:00Z", "0000-01-01T00:00:00Z", "2024-13-45", "yesterday", "1"]) {
      await expectCode(APPEND, { input: event({ occurredAt }) }, "BAD_USER_INPUT", /DateTime/);
    }
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "typed" } })).toBe(0);
    // Well-formed text with emoji, control characters and a date in range are fine.
    const ok = await engram.gql(APPEND, { input: event({ body: "tab\tbell\u0007 🙂 日本", occurredAt: "2024-02-29T12:00:00+01:00" }) });
    expect(ok.errors).toBeUndefined();
  });

  it("enum, paging and cursor errors are BAD_USER_INPUT", async () => {
    await expectCode(APPEND, { input: event({ scope: "NOPE" }) }, "BAD_USER_INPUT", /NOPE/);
    await expectCode(`{ entries(scope: NOPE) { edges { cursor } } }`, undefined, "BAD_USER_INPUT", /NOPE/);
    await expectCode(`{ entries(first: -1) { edges { cursor } } }`, undefined, "BAD_USER_INPUT", /first/);
    await expectCode(`{ events(first: -1) { edges { cursor } } }`, undefined, "BAD_USER_INPUT", /first/);
    await expectCode(`{ entries(after: "garbage!!") { edges { cursor } } }`, undefined, "BAD_USER_INPUT", /base64|cursor/i);
    await expectCode(`{ events(after: "Z2FyYmFnZQ==") { edges { cursor } } }`, undefined, "BAD_USER_INPUT", /cursor/i);
    await expectCode(`{ nope }`, undefined, "BAD_USER_INPUT", /nope/);
    await expectCode(`{ viewer { `, undefined, "BAD_USER_INPUT", /Syntax Error/);
  });

  it("cursors that decode to what no page issues are BAD_USER_INPUT, at any depth and over REST", async () => {
    const b64 = (text: string) => Buffer.from(text).toString("base64");
    const ENTRIES = `query($a: String, $b: String, $s: String) { entries(after: $a, before: $b, search: $s) { edges { cursor } } }`;
    for (const cursor of [b64("OffsetConnection:-5"), b64("OffsetConnection:x"), b64("OffsetConnection:1e3")]) {
      await expectCode(ENTRIES, { a: cursor }, "BAD_USER_INPUT", /`after` is not a cursor/);
      await expectCode(ENTRIES, { a: cursor, s: "hello" }, "BAD_USER_INPUT", /`after` is not a cursor/);
      await expectCode(ENTRIES, { b: cursor }, "BAD_USER_INPUT", /`before` is not a cursor/);
    }
    // An empty page's endCursor, passed back as a pager does, reads from the start.
    const empty = await engram.gql(`{ entries(search: "zzqxnothingmatches") { edges { cursor } pageInfo { endCursor } } }`);
    expect(empty.errors).toBeUndefined();
    const again = await engram.gql(ENTRIES, { a: empty.data.entries.pageInfo.endCursor });
    expect(again.errors).toBeUndefined();
    await expectCode(ENTRIES, { b: b64("OffsetConnection:-1") }, "BAD_USER_INPUT", /`before` is not a cursor/);
    // Pothos decodes a Prisma cursor's typed chunks: a number, null, a date or a NUL reached the store.
    await engram.gql(`mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id } }`, {
      input: { agentExternalId: "a", endUserExternalId: "u", conversationExternalId: "c-cursor", clientTurnId: "t-cursor", userMessage: "hello" },
    });
    for (const cursor of [b64("GPC:N:5"), b64("GPC:Z:"), b64("GPC:D:0"), b64("GPC:S:a\u0000b")]) {
      await expectCode(`query($a: String) { events(after: $a) { edges { cursor } } }`, { a: cursor }, "BAD_USER_INPUT", /cursor/);
      await expectCode(`query($a: String) { conversations { edges { node { messages(after: $a) { edges { cursor } } } } } }`, { a: cursor }, "BAD_USER_INPUT", /cursor/);
    }
    const feedCursor = Buffer.from(JSON.stringify(["2024-01-01T00:00:00.000Z", "\u0000"])).toString("base64url");
    await expectCode(`query($a: String) { memoryFeed(after: $a) { endCursor } }`, { a: feedCursor }, "BAD_USER_INPUT", /cursor/);
    // REST answers the same code, with 400.
    const response = await fetch(`${await serverUrl()}/memory?after=${encodeURIComponent(b64("OffsetConnection:-5"))}`, {
      headers: { authorization: `Bearer ${engram.tenant.reader}` },
    });
    expect(response.status).toBe(400);
    expect((await response.json()).errors[0].extensions.code).toBe("BAD_USER_INPUT");
  });

  it("depth and alias limits answer QUERY_TOO_COMPLEX (the cost limit reports the same way)", async () => {
    const aliased = `{ ${Array.from({ length: 31 }, (_, i) => `v${i}: viewer { role }`).join(" ")} }`;
    await expectCode(aliased, undefined, "QUERY_TOO_COMPLEX", /alias/i);
    const tooDeep = `{ ${nest(12)} }`;
    await expectCode(tooDeep, undefined, "QUERY_TOO_COMPLEX", /depth/i);
  });

  it("the cost limit counts page sizes given in variables, and defaults, as it counts literals", async () => {
    const pages = `query($c: Int = 100, $m: Int = 500) { conversations(first: $c) { edges { node { messages(first: $m) { edges { node { content } } } } } } }`;
    await expectCode(pages, undefined, "QUERY_TOO_COMPLEX", /cost limit/i);
    await expectCode(pages, { c: 100, m: 500 }, "QUERY_TOO_COMPLEX", /cost limit/i);
    await expectCode(`{ conversations(first: 100) { edges { node { messages(first: 500) { edges { node { content } } } } } } }`, undefined, "QUERY_TOO_COMPLEX", /cost limit/i);
    // Within the limit, and introspection (GraphiQL's) free.
    const within = await engram.gql(pages, { c: 10, m: 50 }, engram.tenant.reader);
    expect(within.errors).toBeUndefined();
    const introspection = await engram.gql(getIntrospectionQuery(), undefined, engram.tenant.reader);
    expect(introspection.errors).toBeUndefined();
    // A cost kept for a document is never one a variable could change: an @include condition.
    const included = `query($all: Boolean!) { conversations(first: 100) { edges { node { id messages(first: 500) @include(if: $all) { edges { node { content } } } } } } }`;
    expect((await engram.gql(included, { all: false }, engram.tenant.reader)).errors).toBeUndefined();
    await expectCode(included, { all: true }, "QUERY_TOO_COMPLEX", /cost limit/i);
  });

  it("variables are checked on WebSocket subscriptions too", async () => {
    const url = await serverUrl();
    const client = wsClient(url, engram.tenant.reader);
    const live = collect(client, `subscription($id: ID!) { summaryChanged(conversationId: $id) { accepted } }`, { id: "a\u0000b" });
    await live.next(1).catch(() => undefined);
    expect(JSON.stringify([live.failure, live.received])).toMatch(/NUL/);
    live.dispose();
    await client.dispose();
  });
});

/** A selection nested `levels` deep through fields that exist: `__type { ofType { ofType … } }`. */
function nest(levels: number): string {
  let inner = "name";
  for (let i = 0; i < levels; i++) inner = `ofType { ${inner} }`;
  return `__type(name: "Query") { ${inner} }`;
}

describe("a duplicate key, however it is reported", () => {
  it("is recognised from Prisma's own query (P2002) and from a raw statement (P2010, 23505)", async () => {
    const engram = await startTestEngram();
    try {
      const db = engram.services.db;
      const tenantId = engram.tenant.tenantId;
      await db.agent.create({ data: { tenantId, externalId: "dup-agent", name: "dup" } });
      const viaPrisma = await db.agent.create({ data: { tenantId, externalId: "dup-agent", name: "dup" } }).catch((e) => e);
      const viaRaw = await db.$executeRaw`INSERT INTO "Agent" ("id", "tenantId", "externalId", "name", "updatedAt") VALUES ('dup-raw', ${tenantId}, 'dup-agent', 'dup', now())`.catch((e) => e);
      expect(isUniqueViolation(viaPrisma)).toBe(true);
      expect(isUniqueViolation(viaRaw)).toBe(true);
      expect(isUniqueViolation(new Error("duplicate key"))).toBe(false);
    } finally {
      await engram.stop();
    }
  });
});
