import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { recordTurn } from "./helpers/turns.ts";

// Counts the SQL statements one GraphQL request sends, so N+1 cannot creep back into hot paths.
let engram: TestEngram;
let conversationId = "";
let endUserId = "";
beforeAll(async () => {
  engram = await startTestEngram();
  for (let i = 0; i < 25; i++) {
    await engram.gql(`mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`, {
      input: { scope: "ENTITY", scopeRef: "acme", kind: "note", body: `event ${i} about pricing`, source: "qc", sourceRef: `qc-${i}` },
    });
  }
  for (let i = 0; i < 12; i++) {
    const turn = await recordTurn(engram, { agentExternalId: "qa", endUserExternalId: "qu", conversationExternalId: "qc", userMessage: `question ${i} about pricing`, assistantMessage: `answer ${i}` });
    conversationId = turn.conversation.id;
    endUserId = turn.conversation.endUser.id;
  }
  for (let i = 0; i < 15; i++) {
    await engram.gql(`mutation($input: AddFactInput!) { addFact(input: $input) { id } }`, { input: { endUserId, text: `Fact number ${i} about the user.` } });
  }
});
afterAll(() => engram?.stop());

async function statementsOf(query: string, variables: Record<string, unknown> = {}, key = engram.tenant.reader) {
  const spy = vi.spyOn(pg.Client.prototype, "query");
  try {
    const result = await engram.gql(query, variables, key);
    expect(result.errors).toBeUndefined();
    // The feed's history row of each announcement (one insert) is written just after; wait for it.
    await engram.services.pubsub.settled();
    // Prisma sends each statement once; BEGIN/COMMIT of its transactions count too.
    return spy.mock.calls.length;
  } finally {
    spy.mockRestore();
  }
}

describe("SQL statements per request on the hot paths", () => {
  it("events with their entries: the same count for 5 and 25 rows", async () => {
    const q = `query($n: Int) { events(first: $n) { edges { node { id body entry { id title } } } } }`;
    const few = await statementsOf(q, { n: 5 });
    const many = await statementsOf(q, { n: 25 });
    expect(few).toBeGreaterThan(0);
    expect(many).toBe(few);
    expect(many).toBeLessThanOrEqual(4);
  });

  it("a conversation with its agent, user, messages and revisions", async () => {
    const q = `query($id: ID!) { conversation(id: $id) { agent { name } endUser { externalId } messages(first: 50) { edges { node { seq content } } } revisions { id } } }`;
    expect(await statementsOf(q, { id: conversationId })).toBeLessThanOrEqual(6);
  });

  it("a user's facts with their provenance: no statement per fact", async () => {
    const q = `query($id: ID!) { facts(endUserId: $id) { id text sourceMessage { seq } writtenBy { id } contradicts { id } } }`;
    expect(await statementsOf(q, { id: endUserId })).toBeLessThanOrEqual(8);
  });

  it("memory search across users: one statement per kind, whatever the number of hits", async () => {
    const q = `query($text: String!, $n: Int) { searchMemory(text: $text, first: $n) { kind id endUserName conversationName messageSeq } }`;
    // "about" is an English stop word: the text as typed matches the events and the facts.
    const few = await statementsOf(q, { text: "about", n: 5 });
    const many = await statementsOf(q, { text: "about", n: 40 });
    expect(many).toBe(few);
    // Auth, whether the text has words (with the chosen user's own id), then facts, snippets,
    // entries and events: one statement each.
    expect(many).toBeLessThanOrEqual(6);
  });

  it("the context for the next turn", async () => {
    const q = `query($input: ContextInput!) { context(input: $input) { totalTokens blocks { kind tokens } } }`;
    // Auth, the conversation, the recent and kept messages, entries, facts, the gate's stored
    // verdict and the recall lookups: a fixed number, whatever the conversation's length.
    expect(await statementsOf(q, { input: { conversationId, message: "what about pricing?" } })).toBeLessThanOrEqual(16);
  });

  it("recordTurn on a known conversation: auth, one read, one write, one queue write and the answer", async () => {
    const q = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id firstSeq lastSeq } }`;
    const input = { agentExternalId: "qa", endUserExternalId: "qu", conversationExternalId: "qc", userMessage: "and the price?", assistantMessage: "12 EUR" };
    // Auth, the conversation with any earlier use of the turn id, the one statement that appends
    // the messages and the turn, the turn's follow-up job, the re-read for the selection, and the
    // feed's history row.
    expect(await statementsOf(q, { input: { ...input, clientTurnId: "pinned-1" } }, engram.tenant.writer)).toBe(6);
    // With the caller's gate verdict: one more, its upsert.
    const gate = { remember: false, forget: "NONE", forgetTargets: [], needsRecall: false };
    expect(await statementsOf(q, { input: { ...input, clientTurnId: "pinned-2", gate } }, engram.tenant.writer)).toBe(7);
  });

  it("appendEvent: auth, the insert, the answer and the feed's history row", async () => {
    const q = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`;
    const input = { scope: "ENTITY", scopeRef: "acme", kind: "note", body: "pinned", source: "qc", sourceRef: "pinned-event" };
    expect(await statementsOf(q, { input }, engram.tenant.writer)).toBe(4);
  });
});
