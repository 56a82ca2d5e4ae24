import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { countWords } from "../src/chains/transcript.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { memoryScript } from "./helpers/scripted-memory-model.ts";
import { recordTurn, type TurnInput } from "./helpers/turns.ts";
import { until } from "./helpers/until.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

const CONTEXT = `query($input: ContextInput!) { context(input: $input) { totalTokens baselineTokens savedTokens blocks { kind text tokens items { seq score } } } }`;
const REVISIONS = `query($id: ID!) { summaryRevisions(conversationId: $id) { accepted reason words coveredThroughSeq text } }`;

let model: ModelServer;
let engram: TestEngram;
beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({ worker: true }));
});
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

const say = (conversation: string, n: number, extra: Partial<TurnInput> = {}) =>
  recordTurn(engram, {
    agentExternalId: "concierge",
    endUserExternalId: `guest-${conversation}`,
    conversationExternalId: conversation,
    userMessage:
      n === 1
        ? "My budget is 400 EUR and I need the exact address: 12 Rue de Rivoli."
        : `Question ${n}: what about option ${n}? Please compare it carefully with the previous ones, ` +
          "including the cancellation terms, the breakfast, the distance to the station and whether pets are allowed.",
    assistantMessage:
      `Answer ${n}: option ${n} costs ${100 + n} EUR a night and is available next week. It has free ` +
      "cancellation up to 48 hours before arrival, breakfast is included, the station is a ten minute walk, " +
      "and small pets are welcome for a fee of 15 EUR per stay.",
    ...extra,
  });

describe("the rolling summary, end to end on a scripted OpenAI-compatible server", () => {
  it("runs 30 turns: summaries within the word limit, a rejected rewrite, kept messages, token accounting, all live", async () => {
    model.respond(memoryScript({ reject: (_r, call) => call === 2, essential: [1] }));
    const first = await say("trip", 1);
    const conversationId = first.conversation.id;

    const url = await engram.listen();
    const client = wsClient(url, engram.tenant.reader);
    const live = collect(client, `subscription($id: ID!) { summaryChanged(conversationId: $id) { accepted reason words coveredThroughSeq } }`, { id: conversationId });
    await settle();

    for (let n = 2; n <= 30; n++) {
      await say("trip", n);
      // A pause now and then lets the coalesced rewrite run between bursts.
      if (n % 6 === 0) await until("a rewrite", async () => (await engram.services.db.summaryRevision.count({ where: { conversationId } })) >= n / 6);
    }
    const lastSeq = 60;
    // Everything but the tail of 6 ends up folded into an accepted summary.
    await until("the summary to cover all but the tail", async () => {
      const c = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } });
      return c.summaryThroughSeq === lastSeq - 6;
    });

    const { data } = await engram.gql(REVISIONS, { id: conversationId });
    const revisions = data.summaryRevisions;
    expect(revisions.some((r: any) => !r.accepted && r.reason === "dropped the user's budget of 400 EUR")).toBe(true);
    expect(revisions.filter((r: any) => r.accepted).length).toBeGreaterThanOrEqual(2);
    for (const r of revisions) expect(r.words).toBeLessThanOrEqual(150);
    for (const r of revisions) expect(countWords(r.text)).toBe(r.words);

    // The live record saw the same revisions, the rejected one with its reason.
    await until("the live record", async () => live.received.length >= revisions.length);
    const seen = live.received.map((r) => r.data?.summaryChanged);
    expect(seen.some((r: any) => r.accepted === false && r.reason.includes("400 EUR"))).toBe(true);
    expect(seen.filter((r: any) => r.accepted).length).toBe(revisions.filter((r: any) => r.accepted).length);
    live.dispose();
    await client.dispose();

    // The context: the summary, message 1 kept verbatim on the judge's word, the tail of 6.
    const context = await engram.gql(CONTEXT, { input: { conversationId, message: "So which one should I book?" } });
    const blocks = Object.fromEntries(context.data.context.blocks.map((b: any) => [b.kind, b]));
    expect(Object.keys(blocks)).toEqual(["SUMMARY", "KEPT", "TAIL"]);
    expect(countWords(blocks.SUMMARY.text)).toBeLessThanOrEqual(150);
    expect(blocks.KEPT.items).toEqual([{ seq: 1, score: 3 }]);
    expect(blocks.TAIL.items.map((i: any) => i.seq)).toEqual([55, 56, 57, 58, 59, 60]);
    const { totalTokens, baselineTokens, savedTokens } = context.data.context;
    expect(totalTokens).toBe(blocks.SUMMARY.tokens + blocks.KEPT.tokens + blocks.TAIL.tokens);
    expect(savedTokens).toBe(baselineTokens - totalTokens);
    expect(savedTokens).toBeGreaterThan(0);

    // Every model call was accounted per chain under memory:<model>.
    const usage = await engram.gql(`{ modelUsage { inputTokens outputTokens rows { purpose chain calls } } }`);
    const chains = Object.fromEntries(usage.data.modelUsage.rows.map((r: any) => [r.chain, r]));
    expect(chains.summary.purpose).toBe("memory:gpt-4o-mini");
    expect(chains["loss-judge"].calls).toBe(revisions.length);
    expect(chains["verbatim-judge"].calls).toBe(revisions.filter((r: any) => r.accepted).length);
  });

  it("coalesces a burst of turns into one rewrite", async () => {
    model.respond(memoryScript());
    let conversationId = "";
    const results = [];
    for (let n = 1; n <= 12; n++) results.push(say("burst", n));
    for (const r of await Promise.all(results)) conversationId = r.conversation.id;
    await until("the rewrite", async () => {
      const c = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } });
      return c.summaryThroughSeq === 24 - 6;
    });
    await settle(2_500);
    expect(await engram.services.db.summaryRevision.count({ where: { conversationId } })).toBe(1);
  });

  it("asks a loss judge that keeps rejecting again only when more is said, not every few seconds", async () => {
    model.respond(memoryScript({ reject: () => true }));
    let conversationId = "";
    for (let n = 1; n <= 6; n++) conversationId = (await say("stuck", n)).conversation.id;
    const revisions = () => engram.services.db.summaryRevision.findMany({ where: { conversationId }, select: { accepted: true } });
    await until("a rejected rewrite", async () => (await revisions()).length >= 1);
    // Before, the job ran again every 1.5 s while the same messages were unfolded.
    await settle(6_000);
    expect(await revisions()).toEqual([{ accepted: false }]);
    await say("stuck", 7);
    await until("a rewrite with the new turn", async () => (await revisions()).length === 2);
    model.respond(memoryScript());
  });

  it("keeps recording and serving through a model outage, and catches up when the model is back", async () => {
    model.respond(memoryScript());
    let conversationId = "";
    for (let n = 1; n <= 8; n++) conversationId = (await say("outage", n)).conversation.id;
    const accepted = await until("the first summary", async () => {
      const c = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } });
      return c.summaryThroughSeq === 10 && c.summary;
    });

    let failures = 0;
    model.respond((request) => {
      failures++;
      return request.chain === null ? "{}" : { status: 503, message: "model is down" };
    });
    // Recording does not wait on the model: each turn is recorded (recordTurn throws otherwise).
    for (let n = 9; n <= 14; n++) await say("outage", n);
    await until("the rewrite to fail at least twice (retried with backoff)", async () => failures >= 2, 20_000);
    const during = await engram.gql(CONTEXT, { input: { conversationId, message: "still there?" } });
    const summary = during.data.context.blocks.find((b: any) => b.kind === "SUMMARY");
    expect(summary.text).toBe(JSON.stringify(accepted));
    // Nothing is lost while the summary lags: every unfolded message is still sent verbatim.
    expect(during.data.context.blocks.find((b: any) => b.kind === "TAIL").items.map((i: any) => i.seq)).toEqual(
      Array.from({ length: 18 }, (_, i) => i + 11),
    );

    model.respond(memoryScript());
    await until(
      "the rewrite after the outage",
      async () => (await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } })).summaryThroughSeq === 28 - 6,
      40_000,
    );
  });
});
