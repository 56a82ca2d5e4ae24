import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ChatRequest, ModelServer } from "./helpers/model-server.ts";
import { allIndexed, chromaOf, say } from "./helpers/recall.ts";
import { factsScript, memoryScript, seqsIn } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";

// Forgetting reaches every copy: a unique canary is planted in a user's messages, summaries,
// extraction and indexing copy it around (scripted model), the user is forgotten, and then every
// table of the database and every vector in Chroma is searched for it.

const words = (request: ChatRequest) => request.messages.map((m) => m.content).join("\n");

/** Summaries and verdicts that copy whatever canary the folded messages hold. */
function copyingScript(canaries: string[]) {
  const inPrompt = (request: ChatRequest) => canaries.filter((c) => words(request).includes(c));
  const memory = memoryScript();
  return factsScript(
    {
      triage: (message) => ({
        remember: canaries.some((c) => message.includes(c)),
        ...(/forget my locker code/i.test(message) ? { forget: "SOME" as const, forgetTargets: ["locker code"] } : {}),
      }),
      extract: (messages) =>
        messages
          .filter((m) => m.role === "user" && canaries.some((c) => m.content.includes(c)))
          .map((m) => ({ text: `The user said: ${m.content}`, seq: m.seq })),
    },
    (request) => {
      switch (request.chain) {
        case "summary":
          return JSON.stringify({ summary: `The user mentioned ${inPrompt(request).join(" and ") || "nothing special"}.` });
        case "verbatim-judge":
          return JSON.stringify({
            scores: seqsIn(request, "Older messages:\n").map((seq) => ({ seq, score: inPrompt(request).length ? 3 : 1 })),
          });
        default:
          return memory(request);
      }
    },
  );
}

type Hit = { table: string; row: string };

/** Every row of every table in the test database whose text holds the canary. */
async function rowsHolding(engram: TestEngram, canary: string): Promise<Hit[]> {
  const tables = await engram.services.db.$queryRaw<{ table_name: string }[]>`
    SELECT table_name::text AS table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`;
  const hits: Hit[] = [];
  for (const { table_name } of tables) {
    const rows = await engram.services.db.$queryRawUnsafe<{ row: string }[]>(
      `SELECT t::text AS row FROM "${table_name}" t WHERE t::text ILIKE $1`,
      `%${canary}%`,
    );
    hits.push(...rows.map((r) => ({ table: table_name, row: r.row })));
  }
  return hits;
}

/** Everything Chroma holds for the tenant (ids, metadata, documents) that mentions the canary or the user. */
async function vectorsHolding(engram: TestEngram, tenantId: string, needles: string[]) {
  const chroma = chromaOf(engram);
  const found: string[] = [];
  for (const collection of await chroma.listCollections({ limit: 1000 })) {
    if (!collection.name.startsWith(`engram-${tenantId}-`)) continue;
    const all = await collection.get({ include: ["metadatas", "documents"] as never });
    const text = JSON.stringify(all);
    found.push(...needles.filter((n) => text.includes(n)));
  }
  return found;
}

let model: ModelServer;
let engram: TestEngram;
const CANARY = { deleting: "zqxcanary4471", keeping: "zqxcanary9902", phrase: "zqxcanary3318", fact: "zqxcanary5521" };

beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    env: { ENGRAM_EMBEDDINGS: "offline" },
    respond: copyingScript(Object.values(CANARY)),
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

/** A user who says the canary in one conversation and chats on in another, until every copy exists. */
async function plant(key: string, tenantId: string, user: string, canary: string) {
  const first = await say(engram, { user, conversation: `${user}-1` }, `My passphrase is ${canary}, please keep it in mind.`, `Noted: ${canary}.`, key);
  for (let n = 2; n <= 6; n++) {
    await say(engram, { user, conversation: `${user}-1` }, `Filler question number ${n} about the weather.`, `Filler answer ${n}.`, key);
  }
  await say(engram, { user, conversation: `${user}-2` }, `Another chat; I said ${canary} before.`, "I remember.", key);
  const db = engram.services.db;
  await until("the summary to copy the canary", async () =>
    (await db.conversation.findUnique({ where: { id: first.conversationId } }))?.summary?.includes(canary),
  60_000);
  await until("a fact holding the canary", async () => (await db.fact.count({ where: { tenantId, text: { contains: canary } } })) > 0, 60_000);
  await until("a kept message", async () => (await db.message.count({ where: { conversationId: first.conversationId, keepScore: 3 } })) > 0, 60_000);
  await allIndexed(engram, tenantId, 60_000);
  return first;
}

describe("forgetting a user reaches every copy", () => {
  it("with forgetDeletesMessages on (the default): no trace of the canary anywhere, and a receipt of counts", async () => {
    const tenantId = engram.tenant.tenantId;
    const planted = await plant(engram.tenant.writer, tenantId, "vera", CANARY.deleting);
    // The name the integrator gave the person.
    const named = await engram.gql(`mutation($name: String!) { upsertEndUser(input: { externalId: "vera", displayName: $name }) { displayName } }`, { name: `Vera ${CANARY.deleting}` }, engram.tenant.writer);
    expect(named.data.upsertEndUser.displayName).toBe(`Vera ${CANARY.deleting}`);
    // A skill's notes on the person, under their own id, and a note on someone else.
    const notes = await engram.gql(
      `mutation($body: String!) {
        vera: appendEvent(input: { scope: ENTITY, scopeRef: "vera", kind: "note", body: $body, source: "crm" }) { id }
        entry: createEntry(input: { scope: ENTITY, scopeRef: "vera", title: "Vera", summary: $body }) { id }
        other: appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "note", body: "Renewal in March.", source: "crm" }) { id }
        team: appendEvent(input: { scope: TEAM, scopeRef: "vera", kind: "note", body: "The Vera team ships on Fridays.", source: "crm" }) { id }
      }`,
      { body: `Vera's passphrase is ${CANARY.deleting}.` },
      engram.tenant.writer,
    );
    expect(notes.errors).toBeUndefined();
    expect((await rowsHolding(engram, CANARY.deleting)).map((h) => h.table)).toEqual(
      expect.arrayContaining(["Message", "Fact", "FactVersion", "RecallSnippet", "SummaryRevision", "Conversation", "MemoryEvent", "MemoryEntry"]),
    );

    const forgotten = await engram.gql(
      `mutation($id: ID!) { forgetUser(endUserId: $id) { facts factVersions snippets summaries summaryRevisions keptVerdicts gateVerdicts messages jobRecords events entries } }`,
      { id: planted.endUserId },
      engram.tenant.writer,
    );
    expect(forgotten.errors).toBeUndefined();
    const receipt = forgotten.data.forgetUser;
    expect(receipt).toMatchObject({ summaries: 1, keptVerdicts: expect.any(Number) });
    for (const kind of ["facts", "factVersions", "snippets", "summaryRevisions", "gateVerdicts", "messages"]) {
      expect(receipt[kind], kind).toBeGreaterThan(0);
    }
    expect(receipt).toMatchObject({ events: 1, entries: 1 });
    // Another entity's notes, and a team that happens to share the id, stay.
    expect(await engram.services.db.memoryEvent.count({ where: { id: { in: [notes.data.other.id, notes.data.team.id] } } })).toBe(2);

    // Work still queued for the user's turns finds nothing to bring back.
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    expect(await rowsHolding(engram, CANARY.deleting)).toEqual([]);
    expect(await vectorsHolding(engram, tenantId, [CANARY.deleting, planted.endUserId])).toEqual([]);
    // The person stays known by the caller's own id only (the receipts name it).
    expect(await engram.services.db.endUser.findUniqueOrThrow({ where: { id: planted.endUserId } })).toMatchObject({ externalId: "vera", displayName: null });

    const context = await engram.gql(
      `query($input: ContextInput!) { context(input: $input) { blocks { kind text } } }`,
      { input: { conversationId: planted.conversationId, message: "What did I tell you?" } },
    );
    expect(JSON.stringify(context.data.context.blocks)).not.toContain(CANARY.deleting);

    // The receipt is audited: kinds and counts, never content.
    const audit = await engram.services.db.auditLog.findFirstOrThrow({ where: { tenantId, action: "memory.forget" }, orderBy: { createdAt: "desc" } });
    expect(audit.changes).toMatchObject({ target: { kind: "USER", endUserId: planted.endUserId }, receipt });
  }, 300_000);

  it("with forgetDeletesMessages off: only the user's raw messages still hold it", async () => {
    const tenantId = engram.other.tenantId;
    const off = await engram.gql(`mutation { updateTenantSettings(input: { forgetDeletesMessages: false }) { forgetDeletesMessages } }`, {}, engram.other.admin);
    expect(off.data.updateTenantSettings.forgetDeletesMessages).toBe(false);
    const planted = await plant(engram.other.writer, tenantId, "walt", CANARY.keeping);

    const forgotten = await engram.gql(`mutation($id: ID!) { forgetUser(endUserId: $id) { facts messages summaries } }`, { id: planted.endUserId }, engram.other.writer);
    expect(forgotten.data.forgetUser).toMatchObject({ messages: 0, summaries: 1 });
    expect(forgotten.data.forgetUser.facts).toBeGreaterThan(0);
    await new Promise((resolve) => setTimeout(resolve, 2_000));

    const hits = await rowsHolding(engram, CANARY.keeping);
    expect(hits.length).toBeGreaterThan(0);
    expect(new Set(hits.map((h) => h.table))).toEqual(new Set(["Message"]));
    expect(await vectorsHolding(engram, tenantId, [CANARY.keeping, planted.endUserId])).toEqual([]);

    // Later turns neither fold the old messages into a new summary nor extract them again.
    for (let n = 1; n <= 5; n++) {
      await say(engram, { user: "walt", conversation: "walt-1" }, `New topic ${n}: trains.`, `Trains ${n}.`, engram.other.writer);
    }
    await new Promise((resolve) => setTimeout(resolve, 4_000));
    expect(new Set((await rowsHolding(engram, CANARY.keeping)).map((h) => h.table))).toEqual(new Set(["Message"]));
  }, 300_000);
});

describe("'forget my X' reaches every copy of what matches X", () => {
  it("deletes the matching messages, facts, snippets, summaries and revisions, and keeps the rest", async () => {
    const tenantId = engram.tenant.tenantId;
    const user = "xena";
    const first = await say(engram, { user, conversation: `${user}-1` }, `My locker code is ${CANARY.phrase}.`, "Saved.");
    await say(engram, { user, conversation: `${user}-1` }, "I also love green tea.", "Noted.");
    for (let n = 3; n <= 6; n++) {
      await say(engram, { user, conversation: `${user}-1` }, `Filler ${n} about the weather.`, `Answer ${n}.`);
    }
    const db = engram.services.db;
    await until("the summary to copy the canary", async () =>
      (await db.conversation.findUnique({ where: { id: first.conversationId } }))?.summary?.includes(CANARY.phrase),
    60_000);
    await until("a fact holding the canary", async () => (await db.fact.count({ where: { tenantId, text: { contains: CANARY.phrase } } })) > 0, 60_000);
    await allIndexed(engram, tenantId, 60_000);
    // A skill's notes on the person, under their own id: one saying it, one folded (by
    // compaction) into an entry that does not repeat the words, and others that stay.
    const notes = await engram.gql(
      `mutation($body: String!) {
        saying: appendEvent(input: { scope: ENTITY, scopeRef: "${user}", kind: "note", body: $body, source: "crm", sourceRef: "xena-1" }) { id }
        folded: appendEvent(input: { scope: ENTITY, scopeRef: "${user}", kind: "note", body: "Asked twice about her locker code.", source: "crm", sourceRef: "xena-2" }) { id }
        digest: createEntry(input: { scope: ENTITY, scopeRef: "${user}", title: "Xena, facilities", summary: "Visits the gym on Mondays." }) { id }
        entry: createEntry(input: { scope: ENTITY, scopeRef: "${user}", title: "Locker", summary: $body }) { id }
        tagged: createEntry(input: { scope: ENTITY, scopeRef: "${user}", title: "Access", summary: "Has a badge for the gym.", tags: ["locker", "code"] }) { id }
        tea: appendEvent(input: { scope: ENTITY, scopeRef: "${user}", kind: "note", body: "Drinks green tea.", source: "crm", sourceRef: "xena-3" }) { id }
        other: appendEvent(input: { scope: ENTITY, scopeRef: "yusuf", kind: "note", body: "Yusuf's locker code is 1234.", source: "crm", sourceRef: "yusuf-1" }) { id }
      }`,
      { body: `Xena's locker code is ${CANARY.phrase}.` },
    );
    expect(notes.errors).toBeUndefined();
    await db.memoryEvent.updateMany({ where: { id: { in: [notes.data.folded.id, notes.data.tea.id] } }, data: { entryId: notes.data.digest.id, compressedAt: new Date() } });

    await say(engram, { user, conversation: `${user}-2` }, "Please forget my locker code.", "Done.");
    let left: Hit[] = [];
    await until("the canary to be forgotten", async () => (left = await rowsHolding(engram, CANARY.phrase)).length === 0, 60_000).catch(
      (error) => {
        throw new Error(`${error.message}; still there: ${JSON.stringify(left.map((h) => [h.table, h.row.slice(0, 160)]))}`);
      },
    );
    expect(await vectorsHolding(engram, tenantId, [CANARY.phrase])).toEqual([]);
    // What did not match stays.
    expect(await db.message.count({ where: { conversationId: first.conversationId, content: { contains: "green tea" } } })).toBe(1);
    const { saying, folded, digest, entry, tagged, tea, other } = notes.data;
    expect(await db.memoryEvent.count({ where: { id: { in: [saying.id, folded.id] } } })).toBe(0);
    expect(await db.memoryEntry.count({ where: { id: { in: [digest.id, entry.id, tagged.id] } } })).toBe(0);
    expect(await db.memoryEvent.count({ where: { id: { in: [tea.id, other.id] } } })).toBe(2);
    // The tea note was folded into the deleted digest too: it waits for compaction again, in no entry.
    expect(await db.memoryEvent.findUniqueOrThrow({ where: { id: tea.id } })).toMatchObject({ entryId: null, compressedAt: null });
    const audit = await db.auditLog.findFirstOrThrow({ where: { tenantId, action: "memory.forget" }, orderBy: { createdAt: "desc" } });
    expect(audit.changes).toMatchObject({ target: { kind: "PHRASES", phrases: 1 }, receipt: { events: 2, entries: 3 } });
  }, 300_000);
});

describe("deleteFact reaches the summary", () => {
  it("clears the summaries that folded the fact's message, their revisions and keys, and no rewrite folds it again", async () => {
    const tenantId = engram.tenant.tenantId;
    const db = engram.services.db;
    const who = { user: "ida", conversation: "ida-1" };
    const first = await say(engram, who, `My locker code is ${CANARY.fact}.`, "Saved.");
    const said = await db.message.findFirstOrThrow({ where: { conversationId: first.conversationId, seq: 1 } });
    for (let n = 2; n <= 6; n++) await say(engram, who, `Filler question number ${n} about the weather.`, `Filler answer ${n}.`);
    await until("the summary to copy the canary", async () =>
      (await db.conversation.findUnique({ where: { id: first.conversationId } }))?.summary?.includes(CANARY.fact),
    60_000);
    await until("a fact holding the canary", async () => (await db.fact.count({ where: { tenantId, text: { contains: CANARY.fact } } })) > 0, 60_000);
    await until("the message kept word for word", async () => (await db.message.count({ where: { id: said.id, keepScore: 3 } })) > 0, 60_000);
    await allIndexed(engram, tenantId, 60_000, ["memory.summarize"]);
    expect(await db.recallSnippet.count({ where: { conversationId: first.conversationId, kind: "SUMMARY", text: { contains: CANARY.fact } } })).toBeGreaterThan(0);

    const fact = await db.fact.findFirstOrThrow({ where: { tenantId, text: { contains: CANARY.fact } } });
    const deleted = await engram.gql(`mutation($id: ID!) { deleteFact(id: $id) { change } }`, { id: fact.id });
    expect(deleted.errors).toBeUndefined();
    // The message stays (deleteFact keeps the conversation's record), and is the only copy.
    const only = async () => [...new Set((await rowsHolding(engram, CANARY.fact)).map((h) => h.table))];
    expect(await only()).toEqual(["Message"]);
    expect(await db.message.findUniqueOrThrow({ where: { id: said.id } })).toMatchObject({ keepScore: null });
    const audit = await db.auditLog.findFirstOrThrow({ where: { tenantId, action: "memory.forget" }, orderBy: { createdAt: "desc" } });
    expect(audit.changes).toMatchObject({ target: { kind: "FACT" }, receipt: { facts: 1, summaries: 1 } });

    // The conversation goes on: the next summary starts after what was folded, and never folds the message.
    for (let n = 7; n <= 11; n++) await say(engram, who, `More small talk, number ${n}.`, `Reply ${n}.`);
    await until("a new summary", async () => (await db.conversation.findUnique({ where: { id: first.conversationId } }))?.summary != null, 60_000);
    await allIndexed(engram, tenantId, 60_000, ["memory.summarize"]);
    expect(await only()).toEqual(["Message"]);
    expect(await vectorsHolding(engram, tenantId, [CANARY.fact])).toEqual([]);
  }, 300_000);
});

describe("exportUser: everything held about a person", () => {
  it("answers facts with history, conversations with messages and summaries, snippets, and events and entries of their scope, for admins only", async () => {
    const user = "yara";
    const turn = await say(engram, { user, conversation: `${user}-1` }, "My favourite colour is teal.", "Noted.");
    await engram.gql(`mutation($input: AddFactInput!) { addFact(input: $input) { id } }`, { input: { endUserId: turn.endUserId, text: "The user's favourite colour is teal." } });
    await engram.gql(`mutation { createEntry(input: {scope: ENTITY, scopeRef: "${user}", title: "Prefers teal", summary: "Use teal in mockups."}) { id } }`);
    await engram.gql(`mutation { appendEvent(input: {scope: ENTITY, scopeRef: "${user}", kind: "note", body: "Asked for teal again.", source: "crm", sourceRef: "yara-1"}) { id } }`);
    await allIndexed(engram, engram.tenant.tenantId, 60_000);

    const refused = await engram.gql(`query($id: ID!) { exportUser(endUserId: $id) }`, { id: turn.endUserId }, engram.tenant.reader);
    expect(refused.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    const { data } = await engram.gql(`query($id: ID!) { exportUser(endUserId: $id) }`, { id: turn.endUserId });
    const exported = data.exportUser;
    expect(exported.endUser).toMatchObject({ id: turn.endUserId, externalId: user });
    expect(exported.facts[0]).toMatchObject({ text: "The user's favourite colour is teal.", versions: [expect.objectContaining({ change: "ADDED" })] });
    expect(exported.conversations[0]).toMatchObject({
      externalId: `${user}-1`,
      agent: { externalId: "shop" },
      messages: [expect.objectContaining({ seq: 1, role: "USER", content: "My favourite colour is teal." }), expect.objectContaining({ seq: 2, content: "Noted." })],
    });
    expect(exported.events).toEqual([expect.objectContaining({ body: "Asked for teal again.", source: "crm" })]);
    expect(exported.snippets.map((s: any) => s.text).join("\n")).toContain("teal");
    expect(exported.entries).toEqual([expect.objectContaining({ title: "Prefers teal" })]);
    const other = await engram.gql(`query($id: ID!) { exportUser(endUserId: $id) }`, { id: turn.endUserId }, engram.other.admin);
    expect(other.errors?.[0].extensions?.code).toBe("NOT_FOUND");
  }, 120_000);
});
