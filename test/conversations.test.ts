import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ContextDocument, RecordTurnDocument } from "../src/gql/graphql.ts";
import { forTenant } from "../src/db.ts";
import { forgetPhrases } from "../src/memory/forget.ts";
import { countTokens } from "../src/memory/tokens.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

const RECORD = RecordTurnDocument;
const CONTEXT = ContextDocument;

let engram: TestEngram;
beforeAll(async () => {
  engram = await startTestEngram();
});
afterAll(() => engram?.stop());

let turnCounter = 0;
function turn(conversation: string, overrides: Record<string, unknown> = {}) {
  turnCounter++;
  return {
    agentExternalId: "support-bot",
    endUserExternalId: "user-1",
    conversationExternalId: conversation,
    clientTurnId: `${conversation}-t${turnCounter}`,
    userMessage: `User message ${turnCounter} about the order`,
    assistantMessage: `Assistant reply ${turnCounter}`,
    ...overrides,
  };
}

describe("agents and end users", () => {
  it("upserts agents by external id with default settings, merging changes", async () => {
    const UPSERT = `mutation($input: UpsertAgentInput!) { upsertAgent(input: $input) { id externalId name settings { summaryOn tailSize historySize summaryWordLimit recallOn extractionOn allowSensitiveFacts extractionBatchSize } } }`;
    // The tenant's policy: a writer (a skill's key) may not set an agent's memory settings.
    const byWriter = await engram.gql(UPSERT, { input: { externalId: "planner", settings: { allowSensitiveFacts: true } } }, engram.tenant.writer);
    expect(byWriter.errors?.[0].extensions?.code).toBe("FORBIDDEN");
    const first = await engram.gql(UPSERT, { input: { externalId: "planner", name: "Planner" } });
    expect(first.data.upsertAgent.settings).toEqual({
      summaryOn: true, tailSize: 6, historySize: 20, summaryWordLimit: 150,
      recallOn: true, extractionOn: true, allowSensitiveFacts: false, extractionBatchSize: 8,
    });
    const second = await engram.gql(UPSERT, { input: { externalId: "planner", settings: { tailSize: 4 } } });
    expect(second.data.upsertAgent).toMatchObject({ id: first.data.upsertAgent.id, name: "Planner" });
    expect(second.data.upsertAgent.settings.tailSize).toBe(4);
    const bad = await engram.gql(UPSERT, { input: { externalId: "planner", settings: { tailSize: 0 } } });
    expect(bad.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    const third = await engram.gql(UPSERT, { input: { externalId: "planner", settings: { summaryOn: false } } });
    expect(third.data.upsertAgent.settings).toMatchObject({ tailSize: 4, summaryOn: false });
  });

  it("upserts one new agent from several callers at once: each answers, and no caller's settings are lost", async () => {
    const UPSERT = `mutation($input: UpsertAgentInput!) { upsertAgent(input: $input) { id settings { tailSize historySize summaryWordLimit extractionBatchSize recallOn } } }`;
    const patches = [{ tailSize: 3 }, { historySize: 12 }, { summaryWordLimit: 90 }, { extractionBatchSize: 5 }, { recallOn: false }];
    const answers = await Promise.all(patches.map((settings) => engram.gql(UPSERT, { input: { externalId: "crowd", settings } })));
    expect(answers.map((a) => a.errors)).toEqual(patches.map(() => undefined));
    expect(new Set(answers.map((a) => a.data.upsertAgent.id)).size).toBe(1);
    const last = await engram.gql(UPSERT, { input: { externalId: "crowd" } });
    expect(last.data.upsertAgent.settings).toEqual({ tailSize: 3, historySize: 12, summaryWordLimit: 90, extractionBatchSize: 5, recallOn: false });
    // Each change is audited: who asked, and what they asked for.
    const audited = await engram.services.db.auditLog.findMany({ where: { tenantId: engram.tenant.tenantId, action: "agent.upsert", changes: { path: ["externalId"], equals: "crowd" } } });
    expect(audited.map((a) => (a.changes as { settings: object }).settings)).toEqual(expect.arrayContaining([...patches, {}]));
  });

  it("upserts end users by external id", async () => {
    const UPSERT = `mutation($input: UpsertEndUserInput!) { upsertEndUser(input: $input) { id externalId displayName } }`;
    const a = await engram.gql(UPSERT, { input: { externalId: "u-42", displayName: "Ada" } });
    const b = await engram.gql(UPSERT, { input: { externalId: "u-42" } });
    expect(b.data.upsertEndUser).toEqual(a.data.upsertEndUser);
    const renamed = await engram.gql(UPSERT, { input: { externalId: "u-42", displayName: "Ada L." } });
    expect(renamed.data.upsertEndUser).toEqual({ ...a.data.upsertEndUser, displayName: "Ada L." });
  });
});

describe("recordTurn", () => {
  it("creates the conversation on first use and numbers messages from 1, private steps included but marked", async () => {
    const { data, errors } = await engram.gql(RECORD, {
      input: turn("c-first", { privateSteps: ["search_orders(user-1)"] }),
    });
    expect(errors).toBeUndefined();
    expect(data.recordTurn).toMatchObject({ firstSeq: 1, lastSeq: 3, conversation: { externalId: "c-first", lastSeq: 3 } });
    expect(data.recordTurn.messages.map((m: any) => m.role)).toEqual(["USER", "ASSISTANT"]);
    const all = await engram.services.db.message.findMany({ where: { conversation: { externalId: "c-first" } }, orderBy: { seq: "asc" } });
    expect(all.map((m) => [m.seq, m.private])).toEqual([[1, false], [2, true], [3, false]]);
  });

  it("is idempotent on clientTurnId", async () => {
    const input = turn("c-idem");
    const first = await engram.gql(RECORD, { input });
    const again = await engram.gql(RECORD, { input: { ...input, occurredAt: new Date(Date.now() - 60_000).toISOString() } });
    expect(again.errors).toBeUndefined();
    expect(again.data.recordTurn.id).toBe(first.data.recordTurn.id);
    expect(await engram.services.db.message.count({ where: { conversationId: first.data.recordTurn.conversation.id } })).toBe(2);
  });

  it("refuses a clientTurnId used for other messages (CONFLICT) instead of dropping them", async () => {
    const input = turn("c-idem-other", { privateSteps: ["looked up the order"] });
    const first = await engram.gql(RECORD, { input });
    const conversationId = first.data.recordTurn.conversation.id;
    for (const change of [
      { userMessage: "different text" },
      { assistantMessage: null },
      { assistantMessage: "another reply" },
      { privateSteps: [] },
      { privateSteps: ["looked up the order", "and the invoice"] },
    ]) {
      const clash = await engram.gql(RECORD, { input: { ...input, ...change } });
      expect(clash.errors?.[0].extensions?.code, JSON.stringify(change)).toBe("CONFLICT");
      expect(clash.errors?.[0].message).toContain("other messages");
    }
    // The same messages from another agent or end user are not a retry either.
    for (const change of [{ agentExternalId: "other-bot" }, { endUserExternalId: "user-2" }]) {
      const clash = await engram.gql(RECORD, { input: { ...input, ...change } });
      expect(clash.errors?.[0].extensions?.code, JSON.stringify(change)).toBe("CONFLICT");
    }
    expect(await engram.services.db.message.count({ where: { conversationId } })).toBe(3);
    expect(await engram.services.db.turn.count({ where: { conversationId } })).toBe(1);
    // Once its messages are gone (a forget, the retention window), a retry cannot be compared and
    // is answered with its turn, as before.
    await engram.services.db.message.deleteMany({ where: { conversationId, seq: 1 } });
    const later = await engram.gql(RECORD, { input: { ...input, userMessage: "different text" } });
    expect(later.errors).toBeUndefined();
    expect(later.data.recordTurn.id).toBe(first.data.recordTurn.id);
  });

  it("keeps a gapless sequence under 50 concurrent turns", async () => {
    const results = await Promise.all(Array.from({ length: 50 }, () => engram.gql(RECORD, { input: turn("c-burst") })));
    for (const r of results) expect(r.errors).toBeUndefined();
    const conversationId = results[0].data.recordTurn.conversation.id;
    const seqs = (await engram.services.db.message.findMany({ where: { conversationId }, select: { seq: true }, orderBy: { seq: "asc" } })).map((m) => m.seq);
    expect(seqs).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));
    const ranges = results.map((r) => [r.data.recordTurn.firstSeq, r.data.recordTurn.lastSeq]).sort((a, b) => a[0] - b[0]);
    ranges.forEach(([first, last], i) => expect([first, last]).toEqual([2 * i + 1, 2 * i + 2]));
  });

  it("starts 40 new conversations at once (new agents and users among them), each once, with every turn", async () => {
    const inputs = Array.from({ length: 80 }, (_, i) =>
      turn(`c-new-${i % 40}`, { agentExternalId: `new-agent-${i % 40 % 3}`, endUserExternalId: `new-user-${i % 40 % 7}` }),
    );
    // Each conversation's first turn also arrives twice at once (a client's retry racing it).
    const retries = inputs.slice(0, 40);
    const results = await Promise.all([...inputs, ...retries].map((input) => engram.gql(RECORD, { input })));
    for (const r of results) expect(r.errors).toBeUndefined();
    results.slice(80).forEach((retry, i) => expect(retry.data.recordTurn.id).toBe(results[i].data.recordTurn.id));
    const db = engram.services.db;
    expect(await db.conversation.count({ where: { externalId: { startsWith: "c-new-" } } })).toBe(40);
    expect(await db.agent.count({ where: { externalId: { startsWith: "new-agent-" } } })).toBe(3);
    expect(await db.endUser.count({ where: { externalId: { startsWith: "new-user-" } } })).toBe(7);
    for (const c of await db.conversation.findMany({ where: { externalId: { startsWith: "c-new-" } }, include: { messages: true } })) {
      expect(c.messages.map((m) => m.seq).sort((a, b) => a - b)).toEqual([1, 2, 3, 4]);
    }
  });

  it("refuses a clientTurnId already used in another conversation instead of swallowing the turn", async () => {
    const first = await engram.gql(RECORD, { input: turn("c-id-a", { clientTurnId: "shared-turn-id" }) });
    expect(first.errors).toBeUndefined();
    const clash = await engram.gql(RECORD, { input: turn("c-id-b", { clientTurnId: "shared-turn-id" }) });
    expect(clash.errors?.[0].extensions?.code).toBe("CONFLICT");
    expect(await engram.services.db.conversation.count({ where: { externalId: "c-id-b" } })).toBe(0);
  });

  it("refuses a conversation id that belongs to another user, writing nothing", async () => {
    await engram.gql(RECORD, { input: turn("c-owned") });
    const before = await engram.services.db.message.count();
    const clash = await engram.gql(RECORD, { input: turn("c-owned", { endUserExternalId: "someone-else" }) });
    expect(clash.errors?.[0].extensions?.code).toBe("CONFLICT");
    expect(await engram.services.db.message.count()).toBe(before);
  });

  it("rejects empty messages with BAD_USER_INPUT", async () => {
    const bad = await engram.gql(RECORD, { input: turn("c-bad", { userMessage: "" }) });
    expect(bad.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
  });

  it("uses occurredAt for backfills", async () => {
    const { data } = await engram.gql(RECORD, { input: turn("c-backfill", { occurredAt: "2025-03-01T09:00:00Z" }) });
    const messages = await engram.services.db.message.findMany({ where: { conversationId: data.recordTurn.conversation.id } });
    expect(messages.every((m) => m.occurredAt.toISOString() === "2025-03-01T09:00:00.000Z")).toBe(true);
  });

  it("answers a selection of the turn's own fields from the write, as a re-read would", async () => {
    const OWN = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id clientTurnId occurredAt firstSeq lastSeq } }`;
    const first = await engram.gql(OWN, { input: turn("c-own", { occurredAt: "2025-03-01T09:00:00.250Z" }) });
    const second = await engram.gql(OWN, { input: turn("c-own", { occurredAt: "2025-03-01T09:05:00Z" }) });
    expect(first.data.recordTurn).toMatchObject({ occurredAt: "2025-03-01T09:00:00.250Z", firstSeq: 1, lastSeq: 2 });
    expect(second.data.recordTurn).toMatchObject({ occurredAt: "2025-03-01T09:05:00.000Z", firstSeq: 3, lastSeq: 4 });
    const stored = await engram.services.db.turn.findUniqueOrThrow({ where: { id: second.data.recordTurn.id } });
    expect(second.data.recordTurn).toEqual({ id: stored.id, clientTurnId: stored.clientTurnId, occurredAt: stored.occurredAt.toISOString(), firstSeq: stored.firstSeq, lastSeq: stored.lastSeq });
  });
});

describe("importConversation", () => {
  const IMPORT = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id lastSeq messages(first: 100) { edges { node { seq role content } } } } }`;
  const messages = Array.from({ length: 12 }, (_, i) => ({
    role: i % 2 ? "ASSISTANT" : "USER",
    content: `imported ${i + 1}`,
    occurredAt: `2024-05-0${1 + Math.floor(i / 4)}T10:00:00Z`,
  }));

  it("backfills a whole conversation in one call, in order", async () => {
    const { data, errors } = await engram.gql(IMPORT, {
      input: { agentExternalId: "support-bot", endUserExternalId: "user-9", conversationExternalId: "imported-1", messages },
    });
    expect(errors).toBeUndefined();
    expect(data.importConversation.lastSeq).toBe(12);
    expect(data.importConversation.messages.edges.map((e: any) => e.node.content)).toEqual(messages.map((m) => m.content));
  });

  it("refuses to import other messages into a conversation that has messages; the same import again returns the first", async () => {
    const other = await engram.gql(IMPORT, {
      input: { agentExternalId: "support-bot", endUserExternalId: "user-9", conversationExternalId: "imported-1", messages: messages.slice(1) },
    });
    expect(other.errors?.[0].extensions?.code).toBe("CONFLICT");
    const again = await engram.gql(IMPORT, {
      input: { agentExternalId: "support-bot", endUserExternalId: "user-9", conversationExternalId: "imported-1", messages },
    });
    expect(again.errors).toBeUndefined();
    expect(again.data.importConversation.lastSeq).toBe(12);
  });
});

describe("context", () => {
  it("sends the last history-size messages when the summary is off, with real token counts", async () => {
    await engram.gql(`mutation { upsertAgent(input: {externalId: "no-summary", settings: {summaryOn: false, historySize: 4}}) { id } }`);
    let conversationId = "";
    for (let i = 0; i < 5; i++) {
      const r = await engram.gql(RECORD, { input: turn("c-nosum", { agentExternalId: "no-summary" }) });
      conversationId = r.data.recordTurn.conversation.id;
    }
    const { data } = await engram.gql(CONTEXT, { input: { conversationId, message: "Where is my order?" } }, engram.tenant.reader);
    const kinds = data.context.blocks.map((b: any) => b.kind);
    expect(kinds).toEqual(["TAIL"]);
    const tail = data.context.blocks[0];
    expect(tail.items).toHaveLength(4);
    expect(tail.items.map((i: any) => i.seq)).toEqual([7, 8, 9, 10]);
    expect(tail.tokens).toBe(countTokens(tail.text));
    expect(data.context.totalTokens).toBe(tail.tokens);
    expect(data.context.baselineTokens).toBe(tail.tokens);
    expect(data.context.savedTokens).toBe(0);
    // Recall, the encoder and the vector store all answered.
    expect(data.context.degraded).toEqual([]);
  });

  it("with the summary on but no summary yet, keeps every unsummarised message up to the history size", async () => {
    let conversationId = "";
    for (let i = 0; i < 4; i++) {
      const r = await engram.gql(RECORD, { input: turn("c-nosum-yet") });
      conversationId = r.data.recordTurn.conversation.id;
    }
    const { data } = await engram.gql(CONTEXT, { input: { conversationId, message: "hello" } });
    expect(data.context.blocks.map((b: any) => b.kind)).toEqual(["TAIL"]);
    expect(data.context.blocks[0].items).toHaveLength(8);
  });

  it("serves the summary, the judge's kept messages and the tail, with savings against the baseline", async () => {
    let conversationId = "";
    for (let i = 0; i < 12; i++) {
      const r = await engram.gql(RECORD, { input: turn("c-sum", { userMessage: `A long message number ${i} `.repeat(20) }) });
      conversationId = r.data.recordTurn.conversation.id;
    }
    // As an accepted rewrite leaves it: summary through seq 18, message 3 judged essential.
    await engram.services.db.conversation.update({ where: { id: conversationId }, data: { summary: "The user asked about an order.", summaryThroughSeq: 18 } });
    await engram.services.db.message.updateMany({ where: { conversationId, seq: 3 }, data: { keepScore: 3 } });
    await engram.services.db.message.updateMany({ where: { conversationId, seq: 5 }, data: { keepScore: 1 } });
    const { data } = await engram.gql(CONTEXT, { input: { conversationId, message: "and the refund?" } });
    const byKind = Object.fromEntries(data.context.blocks.map((b: any) => [b.kind, b]));
    expect(Object.keys(byKind)).toEqual(["SUMMARY", "KEPT", "TAIL"]);
    expect(byKind.SUMMARY.text).toBe(JSON.stringify("The user asked about an order."));
    expect(byKind.KEPT.items.map((i: any) => [i.seq, i.score])).toEqual([[3, 3]]);
    expect(byKind.TAIL.items.map((i: any) => i.seq)).toEqual([19, 20, 21, 22, 23, 24]);
    expect(data.context.totalTokens).toBe(byKind.SUMMARY.tokens + byKind.KEPT.tokens + byKind.TAIL.tokens);
    expect(data.context.savedTokens).toBe(data.context.baselineTokens - data.context.totalTokens);
    expect(data.context.savedTokens).toBeGreaterThan(0);
  });

  it("keeps the best 4 scored messages before the tail: none from the tail, none private, essential first then newest", async () => {
    let conversationId = "";
    for (let i = 0; i < 12; i++) {
      const r = await engram.gql(RECORD, { input: turn("c-kept-many") });
      conversationId = r.data.recordTurn.conversation.id;
    }
    const db = engram.services.db;
    await db.conversation.update({ where: { id: conversationId }, data: { summary: "Orders.", summaryThroughSeq: 18 } });
    // The tail's messages (19–24) scored highest of all, and a private one: neither is KEPT.
    await db.message.updateMany({ where: { conversationId, seq: { gte: 19 } }, data: { keepScore: 3 } });
    await db.message.updateMany({ where: { conversationId, seq: 17 }, data: { keepScore: 3, private: true } });
    for (const [seq, keepScore] of [[2, 3], [4, 2], [6, 2], [9, 3], [11, 2], [13, 1]]) {
      await db.message.updateMany({ where: { conversationId, seq }, data: { keepScore } });
    }
    const { data } = await engram.gql(CONTEXT, { input: { conversationId, message: "and the refund?" } });
    const byKind = Object.fromEntries(data.context.blocks.map((b: any) => [b.kind, b]));
    // Both essential ones, then the newest useful ones; in the order they were said.
    expect(byKind.KEPT.items.map((i: any) => [i.seq, i.score])).toEqual([[2, 3], [6, 2], [9, 3], [11, 2]]);
    expect(byKind.TAIL.items.map((i: any) => i.seq)).toEqual([19, 20, 21, 22, 23, 24]);
    // A summary further behind: the verbatim window is longer than the tail (seq 9 to 24), and
    // what it holds is not KEPT again.
    await db.conversation.update({ where: { id: conversationId }, data: { summaryThroughSeq: 8 } });
    const behind = await engram.gql(CONTEXT, { input: { conversationId, message: "and the refund?" } });
    const blocks = Object.fromEntries(behind.data.context.blocks.map((b: any) => [b.kind, b]));
    expect(blocks.TAIL.items.map((i: any) => i.seq)).toEqual([9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 23, 24]);
    expect(blocks.KEPT.items.map((i: any) => [i.seq, i.score])).toEqual([[2, 3], [4, 2], [6, 2]]);
  });

  it("adds curated entries relevant to the message from the agent's and user's scopes", async () => {
    const CREATE = `mutation($input: CreateEntryInput!) { createEntry(input: $input) { id } }`;
    await engram.gql(CREATE, { input: { scope: "ENTITY", scopeRef: "user-1", title: "Refund policy for user-1", summary: "Refunds go to store credit first." } });
    await engram.gql(CREATE, { input: { scope: "ENTITY", scopeRef: "someone-else", title: "Refund rules elsewhere", summary: "Not this user's." } });
    await engram.gql(CREATE, { input: { scope: "ENTITY", scopeRef: "user-1", title: "Shipping notes", summary: "Ships on Mondays." } });
    const r = await engram.gql(RECORD, { input: turn("c-entries") });
    const { data } = await engram.gql(CONTEXT, { input: { conversationId: r.data.recordTurn.conversation.id, message: "Can I get a refund?" } });
    const entries = data.context.blocks.find((b) => b.kind === "ENTRIES");
    expect(entries?.items).toHaveLength(1);
    expect(entries?.text).toContain("store credit");
  });

  it("matches an entry's ref with its scope: an agent and an end user sharing an id each see their own", async () => {
    const CREATE = `mutation($input: CreateEntryInput!) { createEntry(input: $input) { id } }`;
    const entries = [
      { scope: "ENTITY", scopeRef: "42", title: "Parking permit of person 42", summary: "Person 42 parks in bay 9." },
      { scope: "ENTITY", scopeRef: "7", title: "Parking permit of person 7", summary: "Person 7 parks in bay 3." },
      { scope: "TEAM", scopeRef: "42", title: "Parking rules of team 42", summary: "The team's visitors park outside." },
      { scope: "PROJECT", scopeRef: "42", title: "Parking project 42", summary: "The garage opens in May." },
    ];
    for (const input of entries) expect((await engram.gql(CREATE, { input })).errors).toBeUndefined();
    const titlesFor = async (agentExternalId: string, endUserExternalId: string) => {
      const recorded = await engram.gql(RECORD, { input: turn(`c-collide-${agentExternalId}-${endUserExternalId}`, { agentExternalId, endUserExternalId }) });
      const { data, errors } = await engram.gql(CONTEXT, {
        input: { conversationId: recorded.data.recordTurn.conversation.id, message: "Where can I park, what are the parking rules?" },
      });
      expect(errors).toBeUndefined();
      const block = data.context.blocks.find((b) => b.kind === "ENTRIES");
      // Each item is `- "title": "summary"`, both quoted.
      return (block?.items ?? []).map((i) => JSON.parse(/^- ("(?:[^"\\]|\\.)*"):/.exec(i.text)![1])).sort();
    };
    // Person 7 talking to agent 42: their own entity, the agent's team and project, not person 42's notes.
    expect(await titlesFor("42", "7")).toEqual(["Parking permit of person 7", "Parking project 42", "Parking rules of team 42"]);
    // Person 42 talking to another agent: their own entity; a team or project that shares their id is not theirs.
    expect(await titlesFor("support-bot", "42")).toEqual(["Parking permit of person 42"]);
  });

  it("is NOT_FOUND for an unknown conversation", async () => {
    const { errors } = await engram.gql(CONTEXT, { input: { conversationId: "nope", message: "hi" } });
    expect(errors?.[0].extensions?.code).toBe("NOT_FOUND");
  });
});

describe("messages forgotten but kept as a record (forgetDeletesMessages off)", () => {
  it("are not read back through a conversation's or a turn's messages; exportUser still lists them", async () => {
    const { tenantId, admin, writer, reader } = engram.other;
    const off = await engram.gql(`mutation { updateTenantSettings(input: { forgetDeletesMessages: false }) { forgetDeletesMessages } }`, {}, admin);
    expect(off.data.updateTenantSettings.forgetDeletesMessages).toBe(false);
    const record = async (userMessage: string) => {
      const { data, errors } = await engram.gql(RECORD, { input: turn("kept-record", { endUserExternalId: "olga", userMessage, assistantMessage: "Noted." }) }, writer);
      expect(errors).toBeUndefined();
      return data.recordTurn;
    };
    const first = await record("My locker code is 4471.");
    await record("I also like green tea.");
    const endUserId = first.conversation.endUser.id;
    await forgetPhrases(forTenant(engram.services.db, tenantId), engram.services.deps, endUserId, ["locker code"], { reason: "test" });
    // Kept as a record, marked.
    expect(await engram.services.db.message.count({ where: { conversationId: first.conversation.id, content: { contains: "4471" }, forgottenAt: { not: null } } })).toBe(1);

    // The agent's own read of its conversation (the client's conversation()), as context reads it.
    const read = await engram.gql(
      `query { conversationByExternalId(externalId: "kept-record") { messages(last: 20) { edges { node { seq content } } } } }`,
      {},
      reader,
    );
    const contents = read.data.conversationByExternalId.messages.edges.map((e: any) => e.node.content);
    expect(contents).toContain("I also like green tea.");
    expect(contents.join("\n")).not.toContain("4471");
    // The feed's history re-reads each turn's messages.
    const feed = await engram.gql(
      `query { memoryFeed(kinds: [TURN], first: 50) { items { ... on TurnFeedItem { turn { messages { content } } } } } }`,
      {},
      reader,
    );
    const turns = feed.data.memoryFeed.items.map((item: any) => item.turn.messages.map((m: any) => m.content).join("\n"));
    expect(turns.join("\n")).toContain("green tea");
    expect(turns.join("\n")).not.toContain("4471");
    // The record itself is the admins' export.
    const exported = await engram.gql(`query($id: ID!) { exportUser(endUserId: $id) }`, { id: endUserId }, admin);
    expect(JSON.stringify(exported.data.exportUser.conversations)).toContain("4471");
  });
});

describe("lists most recently active first, page after page", () => {
  const CONVERSATIONS = `query($first: Int, $after: String, $last: Int, $before: String) {
    conversations(first: $first, after: $after, last: $last, before: $before) { edges { node { externalId } } pageInfo { startCursor endCursor hasNextPage hasPreviousPage } } }`;
  const USERS = `query($first: Int, $after: String) { endUsers(first: $first, after: $after) { edges { node { externalId } } pageInfo { endCursor hasNextPage } } }`;
  const talk = (conversation: string, user = `pager-${conversation}`) =>
    engram.gql(RECORD, { input: { ...turn(conversation), agentExternalId: "pager-bot", endUserExternalId: user } });
  const names = (page: { edges: { node: { externalId: string } }[] }) => page.edges.map((edge) => edge.node.externalId);

  it("goes on after the last row of a page as it stood, though that row was active since", async () => {
    for (const name of ["p-a", "p-b", "p-c", "p-d", "p-e"]) expect((await talk(name)).errors).toBeUndefined();
    const first = (await engram.gql(CONVERSATIONS, { first: 2 })).data.conversations;
    expect(names(first)).toEqual(["p-e", "p-d"]);
    // The page's last conversation gets a turn: it moves to the top. Prisma's id cursor began the
    // next page after it there, and repeated p-e.
    await talk("p-d");
    const second = (await engram.gql(CONVERSATIONS, { first: 2, after: first.pageInfo.endCursor })).data.conversations;
    expect(names(second)).toEqual(["p-c", "p-b"]);
    const third = (await engram.gql(CONVERSATIONS, { first: 2, after: second.pageInfo.endCursor })).data.conversations;
    expect(names(third)[0]).toBe("p-a");
    // Backwards from the third page: the rows before it, in the list's order.
    const back = (await engram.gql(CONVERSATIONS, { last: 2, before: third.pageInfo.startCursor })).data.conversations;
    expect(names(back)).toEqual(["p-c", "p-b"]);
    expect(back.pageInfo.hasPreviousPage).toBe(true);
  });

  it("pages end users the same way", async () => {
    const first = (await engram.gql(USERS, { first: 2 })).data.endUsers;
    const [top, last] = names(first);
    // The page's last user is updated, and moves to the top.
    const renamed = await engram.gql(`mutation($input: UpsertEndUserInput!) { upsertEndUser(input: $input) { id } }`, { input: { externalId: last, displayName: "Renamed" } });
    expect(renamed.errors).toBeUndefined();
    const second = (await engram.gql(USERS, { first: 2, after: first.pageInfo.endCursor })).data.endUsers;
    expect(names(second)).toHaveLength(2);
    expect(names(second)).not.toContain(top);
    expect(names(second)).not.toContain(last);
  });

  it("refuses a cursor it did not issue, saying which", async () => {
    const ours = (text: string) => Buffer.from(text).toString("base64url");
    for (const after of ["bm9wZQ", ours("GPC:S:some-id"), ours("recent:2024-01-01T00:00:00.000Z a\u0000b"), ours("recent:0000-01-01T00:00:00.000Z abc")]) {
      const { errors } = await engram.gql(CONVERSATIONS, { first: 2, after });
      expect(errors?.[0]).toMatchObject({ extensions: { code: "BAD_USER_INPUT" }, message: expect.stringContaining("`after` is not a cursor of this list") });
    }
  });
});
