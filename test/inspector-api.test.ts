import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { applyCandidate } from "../src/memory/facts/facts.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { allIndexed, INDEXING_TIMEOUT_MS, say } from "./helpers/recall.ts";

// The API behind the inspector's search and contradiction views (issue 16): memory search across
// users, and settling a contradiction pair; each with its roles and tenant isolation.

const SEARCH = `query($text: String!, $user: ID, $agent: ID, $kinds: [MemoryKind!], $since: DateTime, $until: DateTime) {
  searchMemory(text: $text, endUserId: $user, agentId: $agent, kinds: $kinds, since: $since, until: $until) {
    kind id title text endUserId endUserName conversationId conversationName messageSeq scope scopeRef at } }`;
const RESOLVE = `mutation($id: ID!, $keep: ContradictionChoice!) {
  resolveContradiction(factId: $id, keep: $keep) { kept { id text contradicts { id } } deletedFactId } }`;
const FACTS = `query($id: ID!) { facts(endUserId: $id) { id text contradicts { id } } }`;
const HISTORY = `query($id: ID!) { factHistory(factId: $id) { change reason } }`;
const ADD_FACT = `mutation($input: AddFactInput!) { addFact(input: $input) { id } }`;

let engram: TestEngram;
let ada = { endUserId: "", conversationId: "" };
let bea = { endUserId: "", conversationId: "" };
let agents: Record<string, string> = {};

beforeAll(async () => {
  engram = await startTestEngram({ worker: true });
  const w = engram.tenant.writer;
  ada = await say(engram, { user: "ada", conversation: "trip", agent: "concierge" }, "I want a quiet room near the harbour.", "Noted.", w);
  bea = await say(engram, { user: "bea", conversation: "flat", agent: "broker" }, "The harbour view flat is too loud.", "Sure.", w);
  await engram.gql(ADD_FACT, { input: { endUserId: ada.endUserId, text: "Prefers rooms facing the harbour.", core: true } }, w);
  await engram.gql(ADD_FACT, { input: { endUserId: bea.endUserId, text: "Works nights at the harbour office." } }, w);
  await engram.gql(
    `mutation { createEntry(input: { scope: ENTITY, scopeRef: "ada", title: "Harbour hotels", summary: "Ada's shortlist of harbour hotels.", tags: ["travel"], importance: 3, source: MANUAL }) { id } }`,
    {},
    w,
  );
  await engram.gql(
    `mutation { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "decision", body: "Moved the harbour campaign to May.", source: "crm" }) { id } }`,
    {},
    w,
  );
  // The other tenant holds the same word; no search of tenant A may see it.
  await say(engram, { user: "ada", conversation: "trip", agent: "concierge" }, "Other tenant harbour secret.", "Ok.", engram.other.writer);
  await allIndexed(engram, engram.tenant.tenantId, INDEXING_TIMEOUT_MS);
  const { data } = await engram.gql(`{ agents { id externalId } }`, {}, engram.tenant.reader);
  agents = Object.fromEntries(data.agents.map((a: { id: string; externalId: string }) => [a.externalId, a.id]));
}, INDEXING_TIMEOUT_MS + 60_000);

afterAll(async () => {
  await engram?.stop();
});

const search = (variables: Record<string, unknown>, key = engram.tenant.reader) => engram.gql(SEARCH, variables, key);

describe("searchMemory", () => {
  it("finds facts, entries, events and recall snippets across users, with where each came from", async () => {
    const { data, errors } = await search({ text: "harbour" });
    expect(errors).toBeUndefined();
    const hits = data.searchMemory as { kind: string; text: string; endUserName: string | null; conversationName: string | null; messageSeq: number | null }[];
    expect(new Set(hits.map((h) => h.kind))).toEqual(new Set(["FACT", "ENTRY", "EVENT", "SNIPPET"]));
    expect(hits.some((h) => h.kind === "FACT" && h.endUserName === "ada")).toBe(true);
    expect(hits.some((h) => h.kind === "FACT" && h.endUserName === "bea")).toBe(true);
    const snippet = hits.find((h) => h.kind === "SNIPPET" && h.text.includes("quiet room"));
    expect(snippet).toMatchObject({ endUserName: "ada", conversationName: "trip", messageSeq: 1 });
    expect(hits.some((h) => h.text.includes("secret"))).toBe(false);
  });

  it("filters by user, agent, kind and date", async () => {
    const byUser = (await search({ text: "harbour", user: bea.endUserId })).data.searchMemory;
    expect(byUser.length).toBeGreaterThan(0);
    expect(byUser.every((h: { endUserId: string | null }) => h.endUserId === bea.endUserId)).toBe(true);

    // Ada's own scope brings her entry; the event of "acme" is nobody's, and a project that
    // happens to share her id is not hers.
    await engram.gql(`mutation { createEntry(input: { scope: PROJECT, scopeRef: "ada", title: "Harbour project", summary: "The harbour project's plan." }) { id } }`);
    const ada_ = (await search({ text: "harbour", user: ada.endUserId })).data.searchMemory;
    expect(ada_.map((h: { kind: string }) => h.kind).sort()).toEqual(["ENTRY", "FACT", "SNIPPET"]);
    expect(ada_.find((h: { kind: string }) => h.kind === "ENTRY")).toMatchObject({ scope: "ENTITY", scopeRef: "ada" });

    const byAgent = (await search({ text: "harbour", agent: agents.broker })).data.searchMemory;
    expect(byAgent.length).toBeGreaterThan(0);
    expect(byAgent.every((h: { endUserName: string }) => h.endUserName === "bea")).toBe(true);

    const events = (await search({ text: "harbour", kinds: ["EVENT"] })).data.searchMemory;
    expect(events).toEqual([expect.objectContaining({ kind: "EVENT", title: "decision", scope: "ENTITY", scopeRef: "acme" })]);

    const future = (await search({ text: "harbour", since: new Date(Date.now() + 86_400_000).toISOString() })).data.searchMemory;
    expect(future).toEqual([]);
    const past = (await search({ text: "harbour", until: new Date(Date.now() - 86_400_000).toISOString() })).data.searchMemory;
    expect(past).toEqual([]);
  });

  it("takes text as typed (LIKE's wildcards are literal) and refuses bad input with a code", async () => {
    expect((await search({ text: "%%" })).data.searchMemory).toEqual([]);
    const short = await search({ text: " " });
    expect(short.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    const long = await search({ text: "x".repeat(201) });
    expect(long.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
  });

  it("needs a key, and never crosses tenants, even with the other tenant's ids", async () => {
    expect((await search({ text: "harbour" }, null as never)).errors?.[0].extensions?.code).toBe("UNAUTHENTICATED");
    const other = await search({ text: "harbour", user: ada.endUserId }, engram.other.reader);
    expect(other.errors).toBeUndefined();
    expect(other.data.searchMemory).toEqual([]);
    const theirs = (await search({ text: "harbour" }, engram.other.reader)).data.searchMemory;
    expect(theirs.length).toBeGreaterThan(0);
    expect(theirs.every((h: { text: string }) => h.text.includes("secret"))).toBe(true);
  });
});

describe("resolveContradiction", () => {
  /** A contradiction pair as the extractor leaves it: the newer fact names the older. */
  async function contradiction(older: string, newer: string) {
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const first = await applyCandidate(db, engram.services, {
      endUserId: ada.endUserId,
      candidate: { text: older, core: false, seq: 1 },
      judgment: { durability: "durable", relation: "none", relatedFactId: null, sensitivity: null },
      allowSensitive: false,
      sourceMessageId: null,
      conversationId: ada.conversationId,
    });
    const second = await applyCandidate(db, engram.services, {
      endUserId: ada.endUserId,
      candidate: { text: newer, core: false, seq: 1 },
      judgment: { durability: "durable", relation: "contradiction", relatedFactId: first.factId, sensitivity: null },
      allowSensitive: false,
      sourceMessageId: null,
      conversationId: ada.conversationId,
    });
    expect(second.change).toBe("CONTRADICTED");
    return { older: first.factId!, newer: second.factId! };
  }
  const facts = async () => (await engram.gql(FACTS, { id: ada.endUserId }, engram.tenant.reader)).data.facts as { id: string; text: string; contradicts: { id: string } | null }[];

  it("keeps the newer and deletes the older, with the resolution in the kept fact's history", async () => {
    const pair = await contradiction("Is vegetarian.", "Eats fish now.");
    const { data, errors } = await engram.gql(RESOLVE, { id: pair.newer, keep: "NEWER" }, engram.tenant.writer);
    expect(errors).toBeUndefined();
    expect(data.resolveContradiction).toEqual({ kept: [{ id: pair.newer, text: "Eats fish now.", contradicts: null }], deletedFactId: pair.older });
    const ids = (await facts()).map((f) => f.id);
    expect(ids).toContain(pair.newer);
    expect(ids).not.toContain(pair.older);
    const history = (await engram.gql(HISTORY, { id: pair.newer })).data.factHistory;
    expect(history.at(-1)).toEqual({ change: "RESOLVED", reason: "contradiction resolved: kept over the other fact" });
    // Its history quoted the deleted fact when it was written ("contradicts: …"): not any more.
    expect(JSON.stringify(history)).not.toContain("Is vegetarian");
  });

  it("keeps the older, or both (they stop contradicting)", async () => {
    const a = await contradiction("Lives in Lyon.", "Lives in Nice.");
    expect((await engram.gql(RESOLVE, { id: a.newer, keep: "OLDER" }, engram.tenant.writer)).data.resolveContradiction.deletedFactId).toBe(a.newer);
    expect((await facts()).map((f) => f.id)).toContain(a.older);

    const b = await contradiction("Likes jazz.", "Dislikes jazz.");
    const both = (await engram.gql(RESOLVE, { id: b.newer, keep: "BOTH" }, engram.tenant.writer)).data.resolveContradiction;
    expect(both.deletedFactId).toBeNull();
    expect(both.kept.map((f: { id: string }) => f.id).sort()).toEqual([b.newer, b.older].sort());
    const after = await facts();
    expect(after.find((f) => f.id === b.newer)?.contradicts).toBeNull();
    for (const id of [b.newer, b.older]) {
      expect((await engram.gql(HISTORY, { id })).data.factHistory.at(-1).change).toBe("RESOLVED");
    }
  });

  it("refuses a fact that contradicts nothing, a reader, and another tenant, and changes nothing", async () => {
    const pair = await contradiction("Drives to work.", "Cycles to work.");
    const plain = (await facts()).find((f) => f.text === "Prefers rooms facing the harbour.")!;
    expect((await engram.gql(RESOLVE, { id: plain.id, keep: "NEWER" }, engram.tenant.writer)).errors?.[0].extensions?.code).toBe("CONFLICT");
    expect((await engram.gql(RESOLVE, { id: pair.newer, keep: "NEWER" }, engram.tenant.reader)).errors?.[0].extensions?.code).toBe("FORBIDDEN");
    expect((await engram.gql(RESOLVE, { id: pair.newer, keep: "NEWER" }, engram.other.admin)).errors?.[0].extensions?.code).toBe("NOT_FOUND");
    expect((await engram.gql(RESOLVE, { id: pair.newer, keep: "SOME" }, engram.tenant.writer)).errors).toBeDefined();
    const after = await facts();
    expect(after.find((f) => f.id === pair.newer)?.contradicts).toEqual({ id: pair.older });
    expect(after.some((f) => f.id === pair.older)).toBe(true);
  });
});

describe("README's inspector example", () => {
  /** The block under `<!-- readme-test: inspector-api -->`, run as written. */
  const example = () => {
    const match = /<!-- readme-test: inspector-api -->\n```graphql\n([\s\S]*?)\n```/.exec(readFileSync("README.md", "utf8"));
    if (!match) throw new Error(`README.md has no block marked readme-test: ${"inspector-api"}`);
    return match[1];
  };
  const run = async (operationName: string, variables: Record<string, unknown>, key: string) => {
    const response = await engram.app.yoga.fetch("http://engram.test/graphql", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ query: example(), operationName, variables }),
    });
    return (await response.json()) as { data: any; errors?: unknown[] };
  };

  it("searches with a reader key and resolves with a writer key", async () => {
    const search = await run("Search", {}, engram.tenant.reader);
    expect(search.errors).toBeUndefined();
    expect(search.data.searchMemory.map((h: { kind: string }) => h.kind)).toContain("FACT");
    expect(search.data.searchMemory.map((h: { kind: string }) => h.kind)).toContain("SNIPPET");

    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    const judged = (relation: "none" | "contradiction", relatedFactId: string | null) =>
      ({ durability: "durable", relation, relatedFactId, sensitivity: null }) as const;
    const base = { endUserId: bea.endUserId, allowSensitive: false, sourceMessageId: null, conversationId: bea.conversationId };
    const older = await applyCandidate(db, engram.services, { ...base, candidate: { text: "Rents in Lyon.", core: false, seq: null }, judgment: judged("none", null) });
    const newer = await applyCandidate(db, engram.services, {
      ...base,
      candidate: { text: "Rents in Nice.", core: false, seq: null },
      judgment: judged("contradiction", older.factId),
    });
    const resolved = await run("Resolve", { factId: newer.factId }, engram.tenant.writer);
    expect(resolved.errors).toBeUndefined();
    expect(resolved.data.resolveContradiction).toEqual({ kept: [{ id: newer.factId, text: "Rents in Nice." }], deletedFactId: older.factId });
  });
});
