import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { underConversationLease } from "../src/memory/conversations/leases.ts";
import { conversationTurnsJob } from "../src/queue.ts";
import { planSnippetsOfTurns } from "../src/memory/recall/snippets.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { dispatchPendingTurns } from "../src/work/dispatch.ts";
import { takeFromOutbox } from "../src/work/outbox.ts";
import { ExtractionBusy, HAND_OFF_MS, QUIET_RECHECK_MAX_MS, runConversationTurnsWork, runQuietExtraction, runTurnWork, TurnBusy } from "../src/work/turn-work.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { serverUrl } from "./helpers/store.ts";
import { recordTurn } from "./helpers/turns.ts";

// The turns of an agent whose summary and extraction are on (the default) go through the same
// batched follow-ups as any other: the request writes no job of its own, the round writes their
// snippets and vectors, queues the summary request, the quiet-period timer and the gate job once
// per conversation; that job judges each turn once, in order, then extracts.

let model: ModelServer;
let engram: TestEngram;
const script = factsScript({
  triage: (message) => (/forget my locker code/.test(message) ? { forget: "SOME", forgetTargets: ["locker code"] } : { remember: /^I /.test(message) }),
  extract: (messages) => messages.filter((m) => m.role === "user" && /^I /.test(m.content)).map((m) => ({ text: `The user said: ${m.content}`, seq: m.seq })),
});
beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    respond: script,
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
  const tenantId = () => engram.tenant.tenantId;
  const say = (conversation: string, n: number, userMessage: string) =>
    recordTurn(engram, { agentExternalId: "talker", endUserExternalId: "talker-user", conversationExternalId: conversation, clientTurnId: `${conversation}-${n}`, userMessage, assistantMessage: "Ok." });
  // What HAND_OFF_MS does in production: the conversation's gate job takes a turn still in the
  // outbox only once the round has had that long to write it.
  const age = (turnIds: string[]) => db().turn.updateMany({ where: { id: { in: turnIds } }, data: { createdAt: new Date(Date.now() - HAND_OFF_MS - 1_000) } });

  it("are batched: one summary request, quiet timer and gate job per conversation, which judges each turn once", async () => {
    const turns = [];
    for (let n = 0; n < 6; n++) turns.push(await say(`talk-${n % 2}`, n, n === 3 ? "I keep bees on the roof." : `What about question ${n}?`));
    const ids = turns.map((t) => t.id);
    // The requests wrote no job of their own: their tenant's follow-ups job is the only queue write.
    expect(await jobsOf("memory.turn")).toEqual([]);
    expect(await jobsOf("memory.conversation-turns")).toEqual([]);
    // (one per 200 ms window, so how many depends on the machine's speed)
    expect((await jobsOf("memory.follow-ups")).length).toBeGreaterThanOrEqual(1);

    const queuedAt = Date.now();
    const { turns: drained, indexed } = await runTurnFollowUps(db(), engram.services.deps);
    expect(drained).toBe(6);
    expect(indexed).toBe(6);
    expect(await db().turn.count({ where: { id: { in: ids }, followUpsQueuedAt: null } })).toBe(0);
    expect(await db().recallSnippet.count({ where: { conversationId: { in: turns.map((t) => t.conversation.id) }, kind: "TURN", indexedAt: { not: null } } })).toBe(6);
    // Once per conversation, not once per turn: the summary request, the quiet timer, and the gate
    // job, due a moment later (by when the round has written). No verdict yet: the model decides.
    const conversations = [...new Set(turns.map((t) => t.conversation.id))].sort();
    expect((await jobsOf("memory.summarize")).map((j) => j.data.conversationId).sort()).toEqual(conversations);
    expect((await jobsOf("memory.extract-quiet")).map((j) => j.data.conversationId).sort()).toEqual(conversations);
    const handed = await jobsOf("memory.conversation-turns");
    expect(handed.map((j) => j.data.conversationId).sort()).toEqual(conversations);
    for (const job of handed) expect(job.nextRunAt.getTime()).toBeGreaterThan(queuedAt);
    expect(await engram.services.db.gateVerdict.count({ where: { conversationId: { in: conversations } } })).toBe(0);
    expect(await db().turn.count({ where: { id: { in: ids }, gatedAt: null } })).toBe(6);
    const callsBefore = model.requests.length;

    // The gate job of the conversation with the bees: the model's gate on each of its three turns,
    // in order, then one extraction, read now since one is worth remembering; no second snippet.
    const bees = turns[3];
    const work = await runConversationTurnsWork(db(), engram.services.deps, { tenantId: tenantId(), conversationId: bees.conversation.id });
    expect(work).toMatchObject({ status: "DONE", turns: ["JUDGED", "JUDGED", "JUDGED"], extraction: { status: "EXTRACTED" }, again: false });
    expect(model.requests.slice(callsBefore).map((r) => r.chain)).toEqual(["triage", "triage", "triage", "extract", "fact-judge"]);
    expect(await db().fact.findMany({ select: { text: true } })).toEqual([{ text: "The user said: I keep bees on the roof." }]);
    expect(await db().recallSnippet.count({ where: { conversationId: bees.conversation.id, kind: "TURN" } })).toBe(3);
    expect(await db().turn.count({ where: { conversationId: bees.conversation.id, gatedAt: null } })).toBe(0);
    // Run again (a second round's request, a retry), it judges nothing twice.
    const callsAfter = model.requests.length;
    expect(await runConversationTurnsWork(db(), engram.services.deps, { tenantId: tenantId(), conversationId: bees.conversation.id })).toMatchObject({ turns: [], again: false });
    expect(model.requests.length).toBe(callsAfter);
  }, 120_000);

  it("loses nothing when the round dies after queueing the model's work: the gate job takes the turn out of the outbox itself", async () => {
    const turn = await say("talk-crash", 1, "I moved to Porto.");
    // What a round that queued the gate job and died before its write leaves: the job, and the
    // turn still in the outbox without a snippet. Until HAND_OFF_MS has passed the turn is the round's.
    await engram.services.deps.queue.enqueue(conversationTurnsJob, { tenantId: tenantId(), conversationId: turn.conversation.id }, { delayMs: 1_000 });
    const payload = { tenantId: tenantId(), conversationId: turn.conversation.id };
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ turns: [], again: true });
    await age([turn.id]);
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ status: "DONE", turns: ["JUDGED"], again: false });
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).followUpsQueuedAt).not.toBeNull();
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
    // A round after it finds the turn dispatched: it writes no second snippet.
    await runTurnFollowUps(db(), engram.services.deps);
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
  }, 120_000);

  it("writes a turn's snippet once when a round and the turn's own job take it out of the outbox together", async () => {
    const turn = await say("talk-race", 1, "I collect stamps.");
    const endUserId = turn.conversation.endUser.id;
    // A round read the turn and planned its snippet; the turn's job (a dispatcher's catch-up, say)
    // takes it out of the outbox first; then the round writes what it planned.
    const range = { conversationId: turn.conversation.id, endUserId, firstSeq: turn.firstSeq, lastSeq: turn.lastSeq };
    const planned = await planSnippetsOfTurns(db(), [range]);
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id })).toMatchObject({ status: "DONE" });
    const late = await takeFromOutbox(db(), {
      turnIds: [turn.id],
      snippets: planned.rows.map(({ turn: _, ...row }) => ({ ...row, turnId: turn.id })),
      verdicts: [],
      forgetting: [],
      gated: [],
    });
    expect(late).toEqual({ claimed: [], snippetIds: [] });
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
    // Judged once: the job marked it, and runs again without asking the model.
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).gatedAt).not.toBeNull();
    const calls = model.requests.length;
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id })).toMatchObject({ status: "DONE", verdict: { remember: true } });
    // Whoever judged it extracted: no model call at all, but for a retry after a failed extraction.
    expect(model.requests.length).toBe(calls);
    const retried = await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id }, { retry: true });
    expect(retried).toMatchObject({ status: "DONE", extraction: { status: "NOTHING_NEW" } });
    expect(model.requests.slice(calls).map((r) => r.chain)).not.toContain("triage");
  }, 120_000);

  // On the embedded store one session runs every statement in turn: no other statement can hold the row.
  it.skipIf(!serverUrl)("has a turn's job wait while another worker's statement holds the turn in the outbox", async () => {
    const turn = await say("talk-held", 1, "What is the capital of Peru?");
    // Another worker's round statement holds the turn's row (FOR UPDATE) while this job tries.
    const held = engram.services.db.$transaction(async (tx) => {
      await tx.$queryRaw`SELECT "id" FROM "Turn" WHERE "id" = ${turn.id} FOR UPDATE`;
      await expect(runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id })).rejects.toThrow(TurnBusy);
    }, { timeout: 60_000 });
    await held;
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(0);
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id })).toMatchObject({ status: "DONE" });
    expect(await db().recallSnippet.count({ where: { conversationId: turn.conversation.id, kind: "TURN" } })).toBe(1);
  }, 120_000);

  it("tries the conversation's extraction again when another extraction holds its lease, judging no turn twice by the model", async () => {
    const plain = await say("talk-busy", 1, "What time is it in Lima?");
    await say("talk-busy", 2, "I am learning the cello.");
    await runTurnFollowUps(db(), engram.services.deps);
    // Another worker's extraction holds the conversation's lease.
    await db().conversation.update({ where: { id: plain.conversation.id }, data: { extractionLeaseUntil: new Date(Date.now() + 60_000) } });
    const payload = { tenantId: tenantId(), conversationId: plain.conversation.id };
    await expect(runConversationTurnsWork(db(), engram.services.deps, payload)).rejects.toThrow(ExtractionBusy);
    await db().conversation.update({ where: { id: plain.conversation.id }, data: { extractionLeaseUntil: null } });
    const calls = model.requests.length;
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ status: "DONE", turns: ["JUDGED", "JUDGED"], extraction: { status: "EXTRACTED" } });
    // The retry judged both from their stored verdicts: no second gate call.
    expect(model.requests.slice(calls).map((r) => r.chain)).toEqual(["extract", "fact-judge"]);
    expect((await db().conversation.findUniqueOrThrow({ where: { id: plain.conversation.id } })).extractionLeaseUntil).toBeNull();
  }, 120_000);

  it("has the quiet-period job read soon what a turn marked before a forget asked to remember, when extraction was busy", async () => {
    const harp = await say("talk-harp", 1, "I play the harp.");
    const ask = await say("talk-harp", 2, "Please forget my locker code.");
    await runTurnFollowUps(db(), engram.services.deps);
    await age([ask.id]);
    await db().conversation.update({ where: { id: harp.conversation.id }, data: { extractionLeaseUntil: new Date(Date.now() + 60_000) } });
    const payload = { tenantId: tenantId(), conversationId: harp.conversation.id };
    await expect(runConversationTurnsWork(db(), engram.services.deps, payload)).rejects.toThrow(ExtractionBusy);
    // Both marked (the first just before the forget): a rerun judges neither again, so the
    // quiet-period job, due in seconds rather than the agent's 10 minutes, reads the first now.
    expect(await db().turn.count({ where: { id: { in: [harp.id, ask.id] }, gatedAt: null } })).toBe(0);
    const quiet = (await jobsOf("memory.extract-quiet")).filter((j) => j.data.conversationId === harp.conversation.id);
    expect(quiet).toHaveLength(1);
    expect(quiet[0].nextRunAt.getTime()).toBeLessThan(Date.now() + 60_000);
    await db().conversation.update({ where: { id: harp.conversation.id }, data: { extractionLeaseUntil: null } });
  }, 120_000);

  it("has the quiet-period job read soon what a turn asked to remember when extraction failed: the turn is judged, and no job's retry count needs to remember it", async () => {
    const violin = await say("talk-violin", 1, "I play the violin.");
    await runTurnFollowUps(db(), engram.services.deps);
    const payload = { tenantId: tenantId(), conversationId: violin.conversation.id };
    // The round set the agent's quiet period (10 minutes); the extraction then fails (an outage).
    model.respond((request) => (request.chain === "extract" ? { status: 503 } : script(request)));
    try {
      await expect(runConversationTurnsWork(db(), engram.services.deps, payload)).rejects.toThrow();
    } finally {
      model.respond(script);
    }
    expect((await db().turn.findUniqueOrThrow({ where: { id: violin.id } })).gatedAt).not.toBeNull();
    const quiet = (await jobsOf("memory.extract-quiet")).filter((j) => j.data.conversationId === violin.conversation.id);
    expect(quiet).toHaveLength(1);
    expect(quiet[0].nextRunAt.getTime()).toBeLessThan(Date.now() + 60_000);
    // Its retry may be ended by a busy lease or handed over (neither reads): the quiet-period job reads it.
    expect(await runQuietExtraction(db(), engram.services.deps, payload)).toMatchObject({ status: "EXTRACTED" });
    expect(await db().fact.count({ where: { text: "The user said: I play the violin." } })).toBe(1);
  }, 120_000);

  it("has the quiet-period job held back by an unjudged turn look again soon, and less often the longer that turn waits", async () => {
    const turn = await say("talk-waiting", 1, "I brew my own beer.");
    const payload = { tenantId: tenantId(), conversationId: turn.conversation.id };
    const ageBy = (ms: number) => db().turn.update({ where: { id: turn.id }, data: { createdAt: new Date(Date.now() - ms) } });
    // The gate only behind: a moment later.
    expect(await runQuietExtraction(db(), engram.services.deps, payload)).toMatchObject({ again: true, againInMs: HAND_OFF_MS });
    // Waiting two minutes (the gate's model out, say): about as long again.
    await ageBy(120_000);
    const { againInMs } = await runQuietExtraction(db(), engram.services.deps, payload);
    expect(againInMs).toBeGreaterThanOrEqual(120_000);
    expect(againInMs).toBeLessThan(QUIET_RECHECK_MAX_MS);
    await ageBy(3_600_000);
    expect(await runQuietExtraction(db(), engram.services.deps, payload)).toMatchObject({ again: true, againInMs: QUIET_RECHECK_MAX_MS });
    // Judged: nothing held back.
    await ageBy(HAND_OFF_MS + 1_000);
    await runConversationTurnsWork(db(), engram.services.deps, payload);
    expect(await runQuietExtraction(db(), engram.services.deps, payload)).toMatchObject({ again: false });
  }, 120_000);

  it("has the quiet-period job set its timer again for a message said while it ran", async () => {
    const first = await say("talk-late", 1, "I knit scarves.");
    const payload = { tenantId: tenantId(), conversationId: first.conversation.id };
    await runTurnFollowUps(db(), engram.services.deps);
    await db().turn.updateMany({ where: { conversationId: first.conversation.id }, data: { gatedAt: new Date() } });
    // While the extractor reads, the user says more (judged at once, so nothing holds the job back).
    let said = false;
    model.respond(async (request) => {
      if (request.chain === "extract" && !said) {
        said = true;
        const late = await say("talk-late", 2, "Nothing much.");
        await db().turn.update({ where: { id: late.id }, data: { gatedAt: new Date() } });
      }
      return script(request);
    });
    try {
      expect(await runQuietExtraction(db(), engram.services.deps, payload)).toMatchObject({ status: "EXTRACTED", again: true, againInMs: 600_000 });
    } finally {
      model.respond(script);
    }
    // Read, the timer is not set again.
    expect(await runQuietExtraction(db(), engram.services.deps, payload)).toMatchObject({ again: false });
  }, 120_000);

  it("queues no second gate job for a conversation while one waits to run (one retrying through an outage, say), but makes it due now", async () => {
    const turn = await say("talk-pile", 1, "I grow tomatoes.");
    await runTurnFollowUps(db(), engram.services.deps);
    const conversationId = turn.conversation.id;
    const rows = () =>
      engram.services.db.$queryRaw<{ id: string; due: Date }[]>`
        SELECT "id"::text, "next_run_at" AS "due" FROM "agenda_jobs" WHERE "name" = 'memory.conversation-turns' AND "data"->>'conversationId' = ${conversationId}`;
    const [queued] = await rows();
    expect(queued.due.getTime()).toBeGreaterThan(Date.now());
    // Out of the outbox and unjudged for minutes: the dispatcher's case, but the round's job still waits.
    await db().turn.update({ where: { id: turn.id }, data: { followUpsQueuedAt: new Date(Date.now() - 120_000) } });
    await dispatchPendingTurns(engram.services.deps);
    const after = await rows();
    expect(after).toHaveLength(1);
    expect(after[0].due.getTime()).toBeLessThanOrEqual(Date.now());
    // The waiting job itself, failing, would find no other to leave the turns to.
    const { queue } = engram.services.deps;
    expect(await queue.waiting(conversationTurnsJob, "conversationId", [conversationId], queued.id)).toEqual(new Set());
    expect(await queue.waiting(conversationTurnsJob, "conversationId", [conversationId])).toEqual(new Set([conversationId]));
    // Gone (run and ended, say): the dispatcher queues one.
    await engram.services.db.$executeRaw`DELETE FROM "agenda_jobs" WHERE "id"::text = ${queued.id}`;
    await dispatchPendingTurns(engram.services.deps);
    expect(await rows()).toHaveLength(1);
  }, 120_000);

  it("judges a conversation's turns in order: a forget request its round may still write holds back the turns after it", async () => {
    const ask = await say("talk-order", 1, "Please forget my locker code.");
    const later = await say("talk-order", 2, "I store my bike in the locker.");
    await runTurnFollowUps(db(), engram.services.deps);
    // The round left the forget request in the outbox and took the turn after it.
    expect((await db().turn.findUniqueOrThrow({ where: { id: ask.id } })).followUpsQueuedAt).toBeNull();
    expect((await db().turn.findUniqueOrThrow({ where: { id: later.id } })).followUpsQueuedAt).not.toBeNull();
    const payload = { tenantId: tenantId(), conversationId: ask.conversation.id };
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ turns: [], again: true });
    expect(await db().turn.count({ where: { conversationId: ask.conversation.id, gatedAt: { not: null } } })).toBe(0);
    await age([ask.id]);
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ turns: ["FORGOT", "JUDGED"], again: false });
  }, 120_000);

  it("has a turn's own job judge the conversation's earlier turns first, in order", async () => {
    const first = await say("talk-catch-up", 1, "I swim on Sundays.");
    const second = await say("talk-catch-up", 2, "I cook paella.");
    await runTurnFollowUps(db(), engram.services.deps);
    const calls = model.requests.length;
    // The second turn's job (a dispatcher's catch-up, say) comes before the conversation's gate job.
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: second.id })).toMatchObject({ status: "DONE", verdict: { remember: true }, extraction: { status: "EXTRACTED" } });
    const triaged = model.requests.slice(calls).filter((r) => r.chain === "triage").map((r) => JSON.stringify(r.messages));
    expect(triaged.map((text) => (text.includes("swim") ? "first" : text.includes("paella") ? "second" : "?"))).toEqual(["first", "second"]);
    expect(await db().turn.count({ where: { id: { in: [first.id, second.id] }, gatedAt: null } })).toBe(0);
    expect(await runConversationTurnsWork(db(), engram.services.deps, { tenantId: tenantId(), conversationId: first.conversation.id })).toMatchObject({ turns: [], again: false });
  }, 120_000);

  it("reads nothing for extraction from a turn the gate job stopped at, which a later turn's job takes out itself", async () => {
    const chess = await say("talk-stop", 1, "I play chess.");
    const ask = await say("talk-stop", 2, "Please forget my locker code.");
    const bike = await say("talk-stop", 3, "I ride my bike to work.");
    await runTurnFollowUps(db(), engram.services.deps);
    expect((await db().turn.findUniqueOrThrow({ where: { id: ask.id } })).followUpsQueuedAt).toBeNull();
    const payload = { tenantId: tenantId(), conversationId: chess.conversation.id };
    // The gate job judges the first turn, stops at the forget request (its round's for a moment
    // yet), and extraction (read now: the first is worth remembering) reads only the messages before it.
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ turns: ["JUDGED"], extraction: { status: "EXTRACTED", throughSeq: chess.lastSeq }, again: true });
    const facts = () => db().fact.findMany({ where: { endUserId: chess.conversation.endUser.id }, select: { text: true } });
    expect((await facts()).map((f) => f.text)).not.toContain("The user said: I ride my bike to work.");
    expect((await db().turn.findUniqueOrThrow({ where: { id: bike.id } })).gatedAt).toBeNull();
    // The third turn's own job (a dispatcher's catch-up, say) does not wait: it takes the forget
    // request out, forgets, then judges its own turn, and reads it: the forget closed the
    // conversation to the extractor only through the turn that asked.
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: bike.id })).toMatchObject({
      status: "DONE",
      verdict: { remember: true },
      extraction: { status: "EXTRACTED", throughSeq: bike.lastSeq },
    });
    expect((await facts()).map((f) => f.text)).toContain("The user said: I ride my bike to work.");
    expect(await db().turn.count({ where: { conversationId: chess.conversation.id, gatedAt: null } })).toBe(0);
    expect((await db().turn.findUniqueOrThrow({ where: { id: ask.id } })).followUpsQueuedAt).not.toBeNull();
  }, 120_000);

  it("queues the conversation's gate job for turns come while a turn's own job judged", async () => {
    await engram.gql(`mutation { upsertAgent(input: { externalId: "quiet-talker", settings: { summaryOn: false, extractionOn: false } }) { id } }`);
    const sayQuietly = (n: number, userMessage: string) =>
      recordTurn(engram, { agentExternalId: "quiet-talker", endUserExternalId: "talker-user", conversationExternalId: "talk-quiet", clientTurnId: `talk-quiet-${n}`, userMessage, assistantMessage: "Ok." });
    const ask = await sayQuietly(1, "Please forget my locker code.");
    await runTurnFollowUps(db(), engram.services.deps);
    // The keyword gate's forget request is left for its own job; an agent that does not extract has no gate job.
    const gateJobs = async () => (await jobsOf("memory.conversation-turns")).filter((j) => j.data.conversationId === ask.conversation.id);
    expect((await db().turn.findUniqueOrThrow({ where: { id: ask.id } })).followUpsQueuedAt).toBeNull();
    expect(await gateJobs()).toHaveLength(0);
    // A turn comes while the forget request's job runs: the job leaves it to the gate job it queues.
    const later = await sayQuietly(2, "What is the weather like?");
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: ask.id })).toMatchObject({ status: "FORGOT" });
    expect((await db().turn.findUniqueOrThrow({ where: { id: later.id } })).gatedAt).toBeNull();
    expect(await gateJobs()).toHaveLength(1);
    await age([later.id]);
    expect(await runConversationTurnsWork(db(), engram.services.deps, { tenantId: tenantId(), conversationId: ask.conversation.id })).toMatchObject({ turns: ["JUDGED"], again: false });
  }, 120_000);

  it("judges a conversation's turns one runner at a time: another holding its gate lease leaves them to it", async () => {
    const turn = await say("talk-lease", 1, "What is the tallest tree?");
    await runTurnFollowUps(db(), engram.services.deps);
    await db().conversation.update({ where: { id: turn.conversation.id }, data: { gateLeaseUntil: new Date(Date.now() + 60_000) } });
    // A gate job ends (the holder's end, or the dispatcher, finds what is left); a turn's job waits.
    expect(await runConversationTurnsWork(db(), engram.services.deps, { tenantId: tenantId(), conversationId: turn.conversation.id })).toEqual({ status: "BUSY", again: false });
    await expect(runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id })).rejects.toThrow(TurnBusy);
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).gatedAt).toBeNull();
    await db().conversation.update({ where: { id: turn.conversation.id }, data: { gateLeaseUntil: null } });
    expect(await runTurnWork(db(), engram.services.deps, { tenantId: tenantId(), turnId: turn.id })).toMatchObject({ status: "DONE" });
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).gatedAt).not.toBeNull();
    // The conversation's job then finds it judged.
    expect(await runConversationTurnsWork(db(), engram.services.deps, { tenantId: tenantId(), conversationId: turn.conversation.id })).toMatchObject({ turns: [], again: false });
  }, 120_000);

  it("gives a conversation lease back only while it is still the holder's: one that lapsed and was taken stays with the new holder", async () => {
    const turn = await say("talk-lapse", 1, "What is the longest river?");
    const lease = () => db().conversation.findUniqueOrThrow({ where: { id: turn.conversation.id }, select: { gateLeaseUntil: true } });
    // The usual case: taken while the work runs, given back after it.
    await underConversationLease(db(), turn.conversation.id, "gateLeaseUntil", async () => expect((await lease()).gateLeaseUntil).not.toBeNull());
    expect((await lease()).gateLeaseUntil).toBeNull();
    // The holder's lease lapses (its renewals failed) and another worker takes it meanwhile.
    const theirs = new Date(Date.now() + 90_000);
    theirs.setMilliseconds(0);
    await underConversationLease(db(), turn.conversation.id, "gateLeaseUntil", async () => {
      await db().conversation.update({ where: { id: turn.conversation.id }, data: { gateLeaseUntil: theirs } });
    });
    expect((await lease()).gateLeaseUntil).toEqual(theirs);
    await db().conversation.update({ where: { id: turn.conversation.id }, data: { gateLeaseUntil: null } });
  }, 120_000);

  it("leaves a forget request of an agent that extracts to the conversation's gate job, which forgets once", async () => {
    const turn = await say("talk-forget", 1, "Please forget my locker code.");
    await runTurnFollowUps(db(), engram.services.deps);
    // Not dispatched by the round (the gate job makes its snippet and forgets), no keyword verdict
    // stored, and no turn job of its own.
    expect((await db().turn.findUniqueOrThrow({ where: { id: turn.id } })).followUpsQueuedAt).toBeNull();
    expect(await engram.services.db.gateVerdict.count({ where: { conversationId: turn.conversation.id } })).toBe(0);
    expect((await jobsOf("memory.turn")).filter((j) => j.data.turnId === turn.id)).toHaveLength(0);
    expect((await jobsOf("memory.conversation-turns")).filter((j) => j.data.conversationId === turn.conversation.id)).toHaveLength(1);
    await age([turn.id]);
    const payload = { tenantId: tenantId(), conversationId: turn.conversation.id };
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ turns: ["FORGOT"], again: false });
    const after = await db().turn.findUniqueOrThrow({ where: { id: turn.id } });
    expect(after.followUpsQueuedAt).not.toBeNull();
    expect(after.gatedAt).not.toBeNull();
    // The forget took the stored verdict with it; run again, the job does not judge the turn again.
    const calls = model.requests.length;
    expect(await runConversationTurnsWork(db(), engram.services.deps, payload)).toMatchObject({ turns: [] });
    expect(model.requests.length).toBe(calls);
  }, 120_000);
});
