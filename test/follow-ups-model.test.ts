import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { conversationTurnsJob } from "../src/queue.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { ExtractionBusy, runConversationTurnsWork } from "../src/work/turn-work.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { recordTurn } from "./helpers/turns.ts";

// The turns of an agent whose summary and extraction are on (the default) go through the same
// batched follow-ups as any other: the request writes no job of its own, the round writes their
// snippets and vectors, and queues once per conversation the summary request, the quiet-period
// timer and a job that runs the model's gate on each of its turns, then extraction.

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
const verdictsOf = (conversationId: string) => engram.services.db.gateVerdict.findMany({ where: { conversationId }, orderBy: { remember: "asc" } });
const jobsOf = (name: string) =>
  engram.services.db.$queryRaw<{ data: Record<string, string>; nextRunAt: Date }[]>`
    SELECT "data", "next_run_at" AS "nextRunAt" FROM "agenda_jobs"
    WHERE "name" = ${name} AND "data"->>'tenantId' = ${engram.tenant.tenantId}`;

describe("follow-ups of turns whose agent calls a model", () => {
  it("are batched: per conversation one summary request, one quiet timer and one job for the gate on its turns and extraction", async () => {
    const turns: Awaited<ReturnType<typeof recordTurn>>[] = [];
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
    // The requests wrote no turn job: their tenant's follow-ups job (one per 200 ms window) is
    // their only queue write.
    expect(await jobsOf("memory.turn")).toEqual([]);
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
    // One job per conversation with its turns in order, due a moment later (by when the round has
    // written), and no verdict yet: the model decides, in that job. No turn job.
    const handed = await jobsOf("memory.conversation-turns");
    const turnsOf = (conversationId: string) => turns.filter((t) => t.conversation.id === conversationId).map((t) => t.id);
    expect(Object.fromEntries(handed.map((j) => [j.data.conversationId, j.data.turnIds]))).toEqual(Object.fromEntries(conversations.map((c) => [c, turnsOf(c)])));
    for (const job of handed) expect(job.nextRunAt.getTime()).toBeGreaterThan(queuedAt);
    expect(await jobsOf("memory.turn")).toEqual([]);
    expect(await engram.services.db.gateVerdict.count({ where: { conversationId: { in: conversations } } })).toBe(0);
    const callsBefore = model.requests.length;

    // The job of the conversation with "I keep bees": the model's gate on each of its three turns,
    // then one extraction, read now since one of them is worth remembering; no second snippet.
    const bees = turns[3];
    const work = await runConversationTurnsWork(db(), engram.services.deps, { tenantId: engram.tenant.tenantId, conversationId: bees.conversation.id, turnIds: turnsOf(bees.conversation.id) });
    expect(work).toMatchObject({ status: "DONE", turns: ["GATED", "GATED", "GATED"], extraction: { status: "EXTRACTED" } });
    expect(model.requests.slice(callsBefore).map((r) => r.chain)).toEqual(["triage", "triage", "triage", "extract", "fact-judge"]);
    expect((await verdictsOf(bees.conversation.id)).map((v) => [v.remember, v.decidedBy])).toEqual([[false, "MODEL"], [true, "MODEL"], [false, "MODEL"]].sort());
    expect(await db().fact.findMany({ select: { text: true } })).toEqual([{ text: "The user said: I keep bees on the roof." }]);
    expect(await db().recallSnippet.count({ where: { conversationId: bees.conversation.id, kind: "TURN" } })).toBe(3);
  }, 120_000);

  it("loses nothing when the round dies after queueing the model's work: the job does the turn's follow-ups itself", async () => {
    const turn = await recordTurn(engram, {
      agentExternalId: "talker",
      endUserExternalId: "talker-user",
      conversationExternalId: "talk-crash",
      clientTurnId: "talk-crash-1",
      userMessage: "I moved to Porto.",
      assistantMessage: "Nice.",
    });
    // What a round that queued the conversation's job and died before its write leaves: the job,
    // and the turn still in the outbox without a snippet.
    const payload = { tenantId: engram.tenant.tenantId, conversationId: turn.conversation.id, turnIds: [turn.id] };
    await engram.services.deps.queue.enqueue(conversationTurnsJob, payload, { delayMs: 1_000 });
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ status: "DONE", turns: ["GATED"], extraction: { status: "EXTRACTED" } });
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).followUpsQueuedAt).not.toBeNull();
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
    // A round after it finds the turn dispatched: it writes no second snippet.
    await runTurnFollowUps(db(), engram.services.deps);
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
  }, 120_000);

  it("waits for the batch, not for the lease, when another extraction of the conversation runs and the turn is not worth remembering", async () => {
    const say = (n: number, userMessage: string) =>
      recordTurn(engram, { agentExternalId: "talker", endUserExternalId: "talker-user", conversationExternalId: "talk-busy", clientTurnId: `talk-busy-${n}`, userMessage, assistantMessage: "Ok." });
    const plain = await say(1, "What time is it in Lima?");
    const worth = await say(2, "I am learning the cello.");
    await runTurnFollowUps(db(), engram.services.deps);
    // Another worker's extraction holds the conversation's lease.
    await db().conversation.update({ where: { id: plain.conversation.id }, data: { extractionLeaseUntil: new Date(Date.now() + 60_000) } });
    const payload = (...turnIds: string[]) => ({ tenantId: engram.tenant.tenantId, conversationId: plain.conversation.id, turnIds });
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload(plain.id))).toMatchObject({ status: "DONE", extraction: { status: "BUSY" } });
    // A turn worth remembering is read now: its job runs again once the lease is free.
    await expect(runConversationTurnsWork(db(), engram.services.deps, payload(plain.id, worth.id))).rejects.toThrow(ExtractionBusy);
    await db().conversation.update({ where: { id: plain.conversation.id }, data: { extractionLeaseUntil: null } });
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload(plain.id, worth.id))).toMatchObject({ status: "DONE", extraction: { status: "EXTRACTED" } });
  }, 120_000);
});
