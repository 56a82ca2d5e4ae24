import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { formatTranscript } from "../src/chains/transcript.ts";
import { forTenant, type TenantDb } from "../src/db.ts";
import { keptMessages, verbatimWindow } from "../src/memory/context.ts";
import { agentSettings, type AgentSettings } from "../src/memory/conversations/agents.ts";
import { contextTimeline } from "../src/memory/conversations/timeline.ts";
import { countTokens, lineBreakTail } from "../src/memory/tokens.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

// Every text the tokenizer is handed, so the work a timeline does is counted, not timed.
const tokenized = vi.hoisted(() => [] as string[]);
vi.mock("../src/memory/tokens.ts", async (importOriginal) => {
  const tokens = await importOriginal<typeof import("../src/memory/tokens.ts")>();
  return {
    ...tokens,
    countTokens: (text: string) => {
      tokenized.push(text);
      return tokens.countTokens(text);
    },
  };
});

let engram: TestEngram;
let db: TenantDb;
beforeAll(async () => {
  engram = await startTestEngram();
  db = forTenant(engram.services.db, engram.tenant.tenantId);
});
afterAll(() => engram?.stop());

/** The timeline as it was computed before each message was counted once: the answer to keep. */
async function timelineRecountingEveryWindow(conversationId: string) {
  const conversation = await db.conversation.findUniqueOrThrow({ where: { id: conversationId }, include: { agent: true } });
  const settings = agentSettings(conversation.agent);
  const [turns, messages, revisions] = await Promise.all([
    db.turn.findMany({ where: { conversationId }, orderBy: { lastSeq: "desc" }, take: 200 }),
    db.message.findMany({ where: { conversationId, private: false }, orderBy: { seq: "asc" } }),
    db.summaryRevision.findMany({ where: { conversationId, accepted: true }, orderBy: [{ createdAt: "asc" }, { id: "asc" }] }),
  ]);
  turns.reverse();
  return turns.map((turn, index) => {
    const until = turns[index + 1]?.createdAt ?? new Date();
    const summary = revisions.filter((r) => r.createdAt <= until && r.coveredThroughSeq <= turn.lastSeq).at(-1);
    const upTo = messages.filter((m) => m.seq <= turn.lastSeq);
    const baselineTokens = countTokens(formatTranscript(upTo.slice(-settings.historySize)));
    if (!settings.summaryOn) {
      return { turnId: turn.id, seq: turn.lastSeq, occurredAt: turn.occurredAt, sentTokens: baselineTokens, baselineTokens, summaryTokens: 0 };
    }
    const window = verbatimWindow(upTo, settings, summary?.coveredThroughSeq ?? 0);
    const firstInWindow = window[0]?.seq ?? Number.MAX_SAFE_INTEGER;
    const kept = keptMessages(upTo.filter((m) => m.seq < firstInWindow));
    const summaryTokens = summary ? countTokens(summary.text) : 0;
    const sentTokens =
      summaryTokens +
      (kept.length ? countTokens(formatTranscript(kept)) : 0) +
      (window.length ? countTokens(formatTranscript(window)) : 0);
    return { turnId: turn.id, seq: turn.lastSeq, occurredAt: turn.occurredAt, sentTokens, baselineTokens, summaryTokens };
  });
}

// Endings whose last token a following line break can change (or not): punctuation, quotes,
// escapes, marks, digits, other scripts, a slash.
const ENDINGS = [".", "!", "?", ' "quoted"', " .", "\\", "https://example.com/", "e\u0301", "1234", "日本語", "🙂", "it's", "...", "<b>", "x\ty", "--", "Ab"];

/** A unique mark at the start of each message, found in a tokenized text only if the whole message is in it. */
const markOf = (conversation: number, seq: number) => `msg-${conversation}-${String(seq).padStart(5, "0")} `;

let conversations = 0;

/**
 * A conversation written straight to the store (far quicker than recording 200 turns): each turn
 * a user message, a private step and an answer, turns a minute apart, some messages scored for
 * keeping, and accepted (and one rejected) summary revisions between turns.
 */
async function seedConversation(options: { turns: number; settings: Partial<AgentSettings>; words?: number }) {
  const n = ++conversations;
  const tenantId = engram.tenant.tenantId;
  const agent = await db.agent.create({ data: { tenantId, externalId: `timeline-agent-${n}`, name: "Timeline", settings: options.settings } });
  const endUser = await db.endUser.create({ data: { tenantId, externalId: `timeline-user-${n}` } });
  const conversation = await db.conversation.create({ data: { tenantId, externalId: `timeline-${n}`, agentId: agent.id, endUserId: endUser.id } });
  const start = Date.UTC(2025, 0, 1);
  const filler = Array.from({ length: options.words ?? 12 }, (_, i) => `word${i % 7}`).join(" ");
  const messages: { seq: number; role: "USER" | "ASSISTANT" | "TOOL"; content: string; private: boolean; keepScore: number | null }[] = [];
  const turns: { firstSeq: number; lastSeq: number; at: Date }[] = [];
  for (let t = 0; t < options.turns; t++) {
    const firstSeq = messages.length + 1;
    for (const role of ["USER", "TOOL", "ASSISTANT"] as const) {
      const seq = messages.length + 1;
      const content = `${markOf(n, seq)}${filler} ${ENDINGS[seq % ENDINGS.length]}`;
      messages.push({ seq, role, content, private: role === "TOOL", keepScore: seq % 5 === 0 ? 3 : seq % 7 === 0 ? 2 : seq % 3 === 0 ? 1 : null });
    }
    turns.push({ firstSeq, lastSeq: messages.length, at: new Date(start + t * 60_000) });
  }
  await db.message.createMany({
    data: messages.map((m) => ({ ...m, tenantId, conversationId: conversation.id, occurredAt: new Date(start) })),
  });
  await db.turn.createMany({
    data: turns.map((turn, i) => ({
      tenantId,
      conversationId: conversation.id,
      clientTurnId: `timeline-${n}-${i}`,
      firstSeq: turn.firstSeq,
      lastSeq: turn.lastSeq,
      occurredAt: turn.at,
      createdAt: turn.at,
    })),
  });
  await db.conversation.update({ where: { id: conversation.id }, data: { lastSeq: messages.length } });
  // A revision every 5 turns, covering up to one or three turns behind (so that the tail may
  // reach past what it leaves, at the oldest of 212 turns' points too); beside it a rejected one
  // and one covering past its turn.
  for (let t = 2; t < options.turns; t += 5) {
    const at = new Date(start + t * 60_000 + 30_000);
    const coveredThroughSeq = turns[t % 2 ? t - 3 : t - 1].lastSeq;
    await db.summaryRevision.createMany({
      data: [
        { tenantId, conversationId: conversation.id, text: `Summary at turn ${t}: the user asked about orders.`, words: 8, coveredThroughSeq, accepted: true, createdAt: at },
        { tenantId, conversationId: conversation.id, text: `Rejected at ${t}.`, words: 3, coveredThroughSeq, accepted: false, createdAt: at },
        { tenantId, conversationId: conversation.id, text: `Ahead at ${t}.`, words: 3, coveredThroughSeq: turns[t].lastSeq + 3, accepted: true, createdAt: at },
      ],
    });
  }
  return { conversationId: conversation.id, mark: (seq: number) => markOf(n, seq), messages };
}

describe("contextTimeline", () => {
  it("adds up a transcript's lines to what the joined transcript counts", () => {
    const messages = ENDINGS.map((ending, i) => ({ seq: i + 1, role: i % 2 ? "ASSISTANT" : "USER", content: `message ${i} ends with ${ending}` }));
    for (let size = 1; size <= messages.length; size++) {
      const transcript = messages.slice(0, size);
      const lines = transcript.map((m) => formatTranscript([m]));
      const summed = lines.reduce((sum, line, i) => {
        if (i === lines.length - 1) return sum + countTokens(line);
        const tail = lineBreakTail(line);
        return sum + countTokens(line) - countTokens(tail) + countTokens(tail + "\n");
      }, 0);
      expect(summed).toBe(countTokens(formatTranscript(transcript)));
    }
  });

  it.each([
    ["the defaults", {}],
    ["a short history and tail", { tailSize: 2, historySize: 4 }],
    ["a tail longer than the history", { tailSize: 5, historySize: 2 }],
    ["the summary off", { summaryOn: false, historySize: 3 }],
  ])("answers as before with %s, past the 200-turn cut", async (_, settings) => {
    const { conversationId } = await seedConversation({ turns: 212, settings });
    const points = await contextTimeline(db, conversationId);
    expect(points).toHaveLength(200);
    expect(points).toEqual(await timelineRecountingEveryWindow(conversationId));
  });

  it("answers as before for a conversation shorter than its windows", async () => {
    const { conversationId } = await seedConversation({ turns: 3, settings: { tailSize: 4, historySize: 10 } });
    expect(await contextTimeline(db, conversationId)).toEqual(await timelineRecountingEveryWindow(conversationId));
  });

  it("leaves out messages forgotten but kept as a record, as context does", async () => {
    const { conversationId } = await seedConversation({ turns: 3, settings: { summaryOn: false, historySize: 10 } });
    const before = await contextTimeline(db, conversationId);
    await db.message.updateMany({ where: { conversationId, seq: 1 }, data: { forgottenAt: new Date() } });
    const after = await contextTimeline(db, conversationId);
    for (const [i, point] of after.entries()) expect(point.baselineTokens).toBeLessThan(before[i].baselineTokens);
  });

  it("tokenizes each message it needs once, and no message before the oldest point unless kept", async () => {
    const { conversationId, mark, messages } = await seedConversation({ turns: 230, settings: {}, words: 200 });
    tokenized.length = 0;
    await contextTimeline(db, conversationId);
    const calls = [...tokenized];
    const whole = (seq: number) => calls.filter((text) => text.includes(mark(seq))).length;

    // The oldest of the 200 points ends turn 30; its baseline reaches 20 shared messages back.
    const oldestLastSeq = 30 * 3 + 3;
    const shared = messages.filter((m) => !m.private);
    const firstRead = shared.filter((m) => m.seq <= oldestLastSeq).at(-20)!.seq;
    for (const m of messages) {
      if (m.private) expect(whole(m.seq), `private ${m.seq}`).toBe(0);
      else if (m.seq >= firstRead) expect(whole(m.seq), `message ${m.seq}`).toBe(1);
      else expect(whole(m.seq), `older message ${m.seq}`).toBeLessThanOrEqual((m.keepScore ?? 0) >= 2 ? 1 : 0);
    }
    // Beyond whole messages, only their last words (and each summary once) are counted.
    const lineChars = shared.filter((m) => m.seq >= firstRead).reduce((sum, m) => sum + formatTranscript([m]).length, 0);
    const counted = calls.reduce((sum, text) => sum + text.length, 0);
    expect(counted).toBeLessThan(lineChars * 1.1);

    tokenized.length = 0;
    await timelineRecountingEveryWindow(conversationId);
    // Before: each message was tokenized again in the baseline and the window of each point that showed it (about 19 times here).
    expect(tokenized.reduce((sum, text) => sum + text.length, 0)).toBeGreaterThan(counted * 10);
  });

  it("allows one contextTimeline per request, aliases and fragments included", async () => {
    const { conversationId } = await seedConversation({ turns: 2, settings: {} });
    const field = (alias: string) => `${alias}: contextTimeline(conversationId: "${conversationId}") { seq sentTokens }`;
    const one = await engram.gql(`{ ${field("a")} }`, {}, engram.tenant.reader);
    expect(one.errors).toBeUndefined();
    expect(one.data.a).toHaveLength(2);
    for (const query of [
      `{ ${field("a")} ${field("b")} }`,
      `{ ${field("a")} ...more } fragment more on Query { ${field("b")} }`,
      `{ ${Array.from({ length: 30 }, (_, i) => field(`t${i}`)).join(" ")} }`,
    ]) {
      const tooMany = await engram.gql(query, {}, engram.tenant.reader);
      expect(tooMany.data ?? null).toBeNull();
      expect(tooMany.errors?.[0].extensions?.code).toBe("QUERY_TOO_COMPLEX");
      expect(tooMany.errors?.[0].message).toMatch(/at most 1 contextTimeline per request/);
    }
  });
});
