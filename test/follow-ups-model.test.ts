import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { turnJob } from "../src/queue.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { ExtractionBusy, runTurnWork } from "../src/work/turn-work.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { recordTurn } from "./helpers/turns.ts";

// The turns of an agent whose summary and extraction are on (the default) go through the same
// batched follow-ups as any other: the request writes no job of its own, the round writes their
// snippets and vectors, queues the summary request and the quiet-period timer once per
// conversation, and hands each turn to a turn job that runs only the model's gate and extraction.

let model: ModelServer;
let engram: TestEngram;
beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    respond: factsScript({
      triage: (message) => ({ remember: /^I /.test(message) }),
      extract: (messages) => messages.filter((m) => m.role === "user" && /^I /.test(m.content)).map((m) => ({ text: `The user said: ${m.content}`, seq: m.seq })),
    }),
    embed: (input) => input.map((text) => Array.from({ length: 8 }, (_, i) => Math.sin(text.length + i))),
  }));
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

const db = () => forTenant(engram.services.db, engram.tenant.tenantId);
const jobsOf = (name: string) =>
  engram.services.db.$queryRaw<{ data: Record<string, string>; nextRunAt: Date }[]>`
    SELECT "data", "next_run_at" AS "nextRunAt" FROM "agenda_jobs"
    WHERE "name" = ${name} AND "data"->>'tenantId' = ${engram.tenant.tenantId}`;

describe("follow-ups of turns whose agent calls a model", () => {
  it("are batched: one summary request and quiet timer per conversation, a turn job per turn for the gate and extraction", async () => {
    const turns = [];
    for (let n = 0; n < 6; n++) {
      turns.push(
        await recordTurn(engram, {
          agentExternalId: "talker",
          endUserExternalId: "talker-user",
          conversationExternalId: `talk-${n % 2}`,
          clientTurnId: `talk-${n}`,
          userMessage: n === 3 ? "I keep bees on the roof." : `What about question ${n}?`,
          assistantMessage: "Noted.",
        }),
      );
    }
    const ids = turns.map((t) => t.id);
    // The requests wrote no turn job: their tenant's follow-ups job is the only queue write.
    expect(await jobsOf("memory.turn")).toEqual([]);
    // (one per 200 ms window, so how many depends on the machine's speed)
    expect((await jobsOf("memory.follow-ups")).length).toBeGreaterThanOrEqual(1);

    const queuedAt = Date.now();
    const { turns: drained, indexed } = await runTurnFollowUps(db(), engram.services.deps);
    expect(drained).toBe(6);
    expect(indexed).toBe(6);
    expect(await db().turn.count({ where: { id: { in: ids }, followUpsQueuedAt: null } })).toBe(0);
    expect(await db().recallSnippet.count({ where: { conversationId: { in: turns.map((t) => t.conversation.id) }, kind: "TURN", indexedAt: { not: null } } })).toBe(6);
    // One summary request and one quiet timer per conversation, not one per turn.
    const conversations = [...new Set(turns.map((t) => t.conversation.id))].sort();
    expect((await jobsOf("memory.summarize")).map((j) => j.data.conversationId).sort()).toEqual(conversations);
    expect((await jobsOf("memory.extract-quiet")).map((j) => j.data.conversationId).sort()).toEqual(conversations);
    // A turn job per turn, due a moment later (by when the round has written), and no verdict
    // yet: the model decides, in that job.
    const handed = await jobsOf("memory.turn");
    expect(handed.map((j) => j.data.turnId).sort()).toEqual([...ids].sort());
    for (const job of handed) expect(job.nextRunAt.getTime()).toBeGreaterThan(queuedAt);
    expect(await engram.services.db.gateVerdict.count({ where: { conversationId: { in: conversations } } })).toBe(0);
    const callsBefore = model.requests.length;

    // The turn job of a dispatched turn: the model's gate, then extraction; no second snippet.
    const bees = turns[3];
    const work = (await runTurnWork(db(), engram.services.deps, { tenantId: engram.tenant.tenantId, turnId: bees.id })) as {
      status: string;
      verdict: { remember: boolean; decidedBy: string };
      extraction: { status: string };
    };
    expect(work.status).toBe("DONE");
    expect(work.verdict).toMatchObject({ remember: true, decidedBy: "MODEL" });
    expect(work.extraction.status).toBe("EXTRACTED");
    expect(model.requests.slice(callsBefore).map((r) => r.chain)).toEqual(["triage", "extract", "fact-judge"]);
    expect(await db().fact.findMany({ select: { text: true } })).toEqual([{ text: "The user said: I keep bees on the roof." }]);
    expect(await db().recallSnippet.count({ where: { conversationId: bees.conversation.id, kind: "TURN" } })).toBe(3);
  }, 120_000);

  it("loses nothing when the round dies after queueing the model's work: the turn job does the turn's follow-ups itself", async () => {
    const turn = await recordTurn(engram, {
      agentExternalId: "talker",
      endUserExternalId: "talker-user",
      conversationExternalId: "talk-crash",
      clientTurnId: "talk-crash-1",
      userMessage: "I moved to Porto.",
      assistantMessage: "Nice.",
    });
    // What a round that queued the turn's job and died before its write leaves: the job, and the
    // turn still in the outbox without a snippet.
    await engram.services.deps.queue.enqueue(turnJob, { tenantId: engram.tenant.tenantId, turnId: turn.id }, { delayMs: 1_000 });
    const work = (await runTurnWork(db(), engram.services.deps, { tenantId: engram.tenant.tenantId, turnId: turn.id })) as { status: string };
    expect(work.status).toBe("DONE");
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).followUpsQueuedAt).not.toBeNull();
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
    // A round after it finds the turn dispatched: it writes no second snippet.
    await runTurnFollowUps(db(), engram.services.deps);
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
  }, 120_000);

  it("tries a turn's extraction again when another extraction of the conversation holds its lease, the lease is one statement to take", async () => {
    const say = (n: number, userMessage: string) =>
      recordTurn(engram, { agentExternalId: "talker", endUserExternalId: "talker-user", conversationExternalId: "talk-busy", clientTurnId: `talk-busy-${n}`, userMessage, assistantMessage: "Ok." });
    const plain = await say(1, "What time is it in Lima?");
    const worth = await say(2, "I am learning the cello.");
    await runTurnFollowUps(db(), engram.services.deps);
    // Another worker's extraction holds the conversation's lease.
    await db().conversation.update({ where: { id: plain.conversation.id }, data: { extractionLeaseUntil: new Date(Date.now() + 60_000) } });
    const payload = (turnId: string) => ({ tenantId: engram.tenant.tenantId, turnId });
    // Worth remembering or not (a turn that fills a batch has no other reader when the agent's
    // quiet-period timer is off), the job runs again once the lease is free.
    await expect(runTurnWork(db(), engram.services.deps, payload(plain.id))).rejects.toThrow(ExtractionBusy);
    await expect(runTurnWork(db(), engram.services.deps, payload(worth.id))).rejects.toThrow(ExtractionBusy);
    await db().conversation.update({ where: { id: plain.conversation.id }, data: { extractionLeaseUntil: null } });
    expect(await runTurnWork(db(), engram.services.deps, payload(worth.id))).toMatchObject({ status: "DONE", extraction: { status: "EXTRACTED" } });
    expect((await db().conversation.findUniqueOrThrow({ where: { id: plain.conversation.id } })).extractionLeaseUntil).toBeNull();
  }, 120_000);
  it("leaves a forget request of an agent that extracts to its own job, for the model to say what to forget", async () => {
    const turn = await recordTurn(engram, { agentExternalId: "talker", endUserExternalId: "talker-user", conversationExternalId: "talk-forget", clientTurnId: "talk-forget-1", userMessage: "Please forget my locker code.", assistantMessage: "Ok." });
    await runTurnFollowUps(db(), engram.services.deps);
    // Not dispatched by the round (its job makes its snippet and forgets), and no keyword verdict stored.
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).followUpsQueuedAt).toBeNull();
    expect(await engram.services.db.gateVerdict.count({ where: { conversationId: turn.conversation.id } })).toBe(0);
    expect((await jobsOf("memory.turn")).filter((j) => j.data.turnId === turn.id)).toHaveLength(1);
  }, 120_000);
});
