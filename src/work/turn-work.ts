import type { z } from "zod";
import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { agentSettings, type AgentSettings } from "../memory/conversations/agents.ts";
import { underConversationLease } from "../memory/conversations/leases.ts";
import { extractFacts, type ExtractionResult } from "../memory/facts/extraction.ts";
import { forgetPhrases, forgetUser } from "../memory/forget.ts";
import { gateMessage, storedGateVerdict, type StoredVerdict } from "../memory/gate/gate.ts";
import { planSnippetsOfTurns, type TurnRange } from "../memory/recall/snippets.ts";
import { conversationTurnsJob, extractJob, quietExtractJob, type turnJob } from "../queue.ts";
import { refusalsCounted, UnreadableAnswer } from "./dead-letter.ts";
import { factKeysOf, indexFactKeys, queueIndexing } from "./index-snippets.ts";
import { markGated, takeFromOutbox } from "./outbox.ts";
import { requestSummary } from "./summarize.ts";

type TurnWorkDeps = Pick<Deps, "models" | "queue" | "pubsub" | "vectors" | "embeddings" | "log">;

/**
 * One extraction of a conversation, its facts' recall keys indexed. Another extraction of it
 * running (BUSY) may not have read these turns, so the job tries again later (ExtractionBusy: the
 * gate's verdicts are stored and the turns marked judged, so the retry costs no second gate call);
 * an answer that cannot be read is retried too.
 */
async function runExtraction(db: TenantDb, deps: TurnWorkDeps, conversationId: string, options: { now: boolean; beforeSeq?: number }) {
  const tenantId = db.$tenantId();
  const [extractor, judge] = await Promise.all([
    chainFor(deps.models, tenantId, "extract"),
    chainFor(deps.models, tenantId, "fact-judge"),
  ]);
  if (!extractor || !judge) return { status: "MODEL_OFF" as const };
  const result = await refusalsCounted(
    "fact extraction",
    extractFacts(db, { extractor, judge, pubsub: deps.pubsub, vectors: deps.vectors, log: deps.log, queue: deps.queue }, conversationId, options),
  );
  if (result.status === "EXTRACTED" && result.outcomes.some((o) => o.factId && o.change !== "REFRESHED")) {
    await indexFactKeys(db, deps, conversationId);
  }
  if (result.status === "BUSY") throw new ExtractionBusy();
  if (result.status === "UNPARSABLE") throw new UnreadableAnswer("fact extraction");
  return result;
}

/**
 * The model's work a conversation's new turns start, queued once per turn or once per batch of
 * them (work/follow-ups.ts): the summary rewrite, coalesced per conversation; seed 003's timer,
 * which every shared turn sets again, so that when the conversation has been quiet that long the
 * extractor reads what is pending even below a batch; and for an imported conversation,
 * extraction until caught up.
 */
export async function queueConversationWork(
  deps: Pick<Deps, "queue">,
  tenantId: string,
  conversationId: string,
  settings: AgentSettings,
  options: { imported: boolean },
) {
  if (settings.summaryOn) await requestSummary(deps, tenantId, conversationId);
  if (settings.extractionOn && settings.quietExtractionSeconds > 0 && !options.imported) {
    await deps.queue.enqueueCoalesced(quietExtractJob, { tenantId, conversationId }, "conversationId", settings.quietExtractionSeconds * 1_000);
  }
  if (options.imported && settings.extractionOn) {
    await deps.queue.enqueueCoalesced(extractJob, { tenantId, conversationId }, "conversationId", 1_000);
  }
}

/** Another run holds the conversation's extraction lease: the job is retried soon (jobs/backoff.ts). */
export class ExtractionBusy extends Error {
  constructor() {
    super("extraction of this conversation is running; retrying later");
    this.name = "ExtractionBusy";
  }
}

/**
 * Another worker's statement holds the turn in the outbox this moment, or another runner is
 * judging the conversation's turns, or more than a run's worth of earlier turns came first: the
 * job runs again soon (jobs/turn.ts).
 */
export class TurnBusy extends Error {
  constructor() {
    super("another worker is taking this turn out of the outbox or judging its conversation; retrying later");
    this.name = "TurnBusy";
  }
}

/** From the job runner: `stillAlive` keeps the job's lock between rounds; `retry`, this job failed before (jobs/turn.ts). */
type JobRunOptions = { stillAlive?: () => Promise<unknown>; retry?: boolean };

type TurnRow = TurnRange & { id: string; clientTurnId: string; followUpsQueuedAt: Date | null; gatedAt: Date | null };
type ConversationOf = { id: string; endUserId: string; settings: AgentSettings };

const turnFields = { id: true, conversationId: true, clientTurnId: true, firstSeq: true, lastSeq: true, followUpsQueuedAt: true, gatedAt: true } as const;

async function conversationOf(db: TenantDb, conversationId: string): Promise<ConversationOf | null> {
  const row = await db.conversation.findUnique({ where: { id: conversationId }, select: { id: true, endUserId: true, agent: { select: { settings: true } } } });
  return row && { id: row.id, endUserId: row.endUserId, settings: agentSettings(row.agent) };
}

/**
 * A turn still in the outbox, taken out by its own job (a forget request, an import, a turn the
 * dispatcher caught up, or one whose round died before writing): the conversation's work is
 * queued first, then the turn is claimed with its snippets in one statement, as a round takes
 * its turns (work/outbox.ts), so a round running beside this job cannot write them a second
 * time. The snippets are embedded by an index job.
 */
async function dispatchTurn(db: TenantDb, deps: TurnWorkDeps, turn: TurnRow, conversation: ConversationOf) {
  const tenantId = db.$tenantId();
  const imported = turn.clientTurnId.startsWith("import:");
  await queueConversationWork(deps, tenantId, conversation.id, conversation.settings, { imported });
  const planned = await planSnippetsOfTurns(db, [turn]);
  const written = await takeFromOutbox(db, {
    turnIds: [turn.id],
    snippets: planned.rows.map(({ turn: _, ...row }) => ({ ...row, turnId: turn.id })),
    verdicts: [],
    forgetting: [],
    // An import has no gate: its conversation is extracted until caught up.
    gated: imported ? [turn.id] : [],
  });
  if (written.claimed.length === 0) {
    const now = await db.turn.findUnique({ where: { id: turn.id }, select: { followUpsQueuedAt: true } });
    if (now && !now.followUpsQueuedAt) throw new TurnBusy();
    return; // another round or job took it, with its snippets
  }
  const made = [...planned.waiting.map((s) => s.id), ...written.snippetIds];
  made.push(...(await factKeysOf(db, deps, [conversation.endUserId], planned.messages.map((m) => m.id))));
  await queueIndexing(deps, tenantId, made);
}

type Judged = { turnId: string } & (
  | { status: "NO_USER_MESSAGE" }
  | { status: "JUDGED"; verdict: StoredVerdict }
  | { status: "FORGOT"; verdict: StoredVerdict; forgotten: unknown }
);

/** The user message that opens a turn, unless forgotten. */
function userMessageOf(db: TenantDb, conversationId: string, turn: Pick<TurnRow, "firstSeq">) {
  return db.message.findFirst({ where: { conversationId, seq: turn.firstSeq, role: "USER", forgottenAt: null }, select: { id: true, content: true } });
}

/**
 * The gate on a turn's user message: the verdict the caller or context assembly gave, else a new
 * one (the model's where the agent extracts, the keywords' elsewhere). What it asks to forget is
 * the caller's to do (forgetAsked), under the conversation's gate lease.
 */
async function judgeTurn(db: TenantDb, deps: TurnWorkDeps, turn: TurnRow, conversation: ConversationOf): Promise<Judged> {
  const userMessage = await userMessageOf(db, conversation.id, turn);
  if (!userMessage) return { turnId: turn.id, status: "NO_USER_MESSAGE" };
  const triage = conversation.settings.extractionOn ? await chainFor(deps.models, db.$tenantId(), "triage") : null;
  const verdict = await gateMessage(db, { triage, log: deps.log }, { conversationId: conversation.id, messageId: userMessage.id, message: userMessage.content });
  return { turnId: turn.id, status: "JUDGED", verdict };
}

/**
 * What a judged turn asked to forget, then the turn marked judged at once: the forget takes the
 * stored verdicts with it, so a retry that judged the turn again would ask the model again and
 * could forget again what the user said since.
 */
async function forgetAsked(db: TenantDb, deps: TurnWorkDeps, turn: Pick<TurnRow, "id" | "lastSeq">, conversation: ConversationOf, verdict: StoredVerdict): Promise<Judged> {
  const who = { reason: "the user asked to forget", conversationId: conversation.id, askedThroughSeq: turn.lastSeq };
  const forgotten =
    verdict.forget === "ALL"
      ? await forgetUser(db, deps, conversation.endUserId, { ...who, reason: "the user asked to forget everything" })
      : await forgetPhrases(db, deps, conversation.endUserId, verdict.forgetTargets, who);
  await markGated(db, [turn.id]);
  return { turnId: turn.id, status: "FORGOT", verdict, forgotten };
}

/**
 * Judging under the conversation's gate lease: one runner at a time judges a conversation's
 * turns (its gate job, a turn's own job, on any worker), each reading the marks after the one
 * before has written them. Another holding it: TurnBusy, and the job runs again in a moment.
 */
async function underGateLease<T extends object>(db: TenantDb, conversationId: string, work: () => Promise<T>): Promise<T | { status: "GONE" }> {
  const result = await underConversationLease(db, conversationId, "gateLeaseUntil", work);
  if ("status" in result && result.status === "BUSY") throw new TurnBusy();
  return result as T | { status: "GONE" };
}

// Turns judged per run of a conversation's gate job.
const PER_RUN = 200;

/**
 * A conversation's gate job runs this long after the first round of a burst that asked for it (by
 * when those rounds have written their turns: queue writes took hundreds of milliseconds each on
 * the embedded store under load), and again this long after a run that left turns unjudged. The
 * gate job leaves a turn still in the outbox to its round for this long; after it, the job takes
 * it out itself.
 */
export const HAND_OFF_MS = 5_000;

const unjudgedTurns = (conversationId: string) => ({ conversationId, gatedAt: null, NOT: { clientTurnId: { startsWith: "import:" } } });

/**
 * Where extraction after the gate stops: the first message of the conversation's earliest turn
 * not yet judged (but those of `judged`, this run's, marked after extraction), so that it never
 * reads a turn before the gate has done what it asks (a forget request above all).
 */
async function firstUnjudgedSeq(db: TenantDb, conversationId: string, judged: string[] = []) {
  return (await firstUnjudged(db, conversationId, judged))?.firstSeq;
}

function firstUnjudged(db: TenantDb, conversationId: string, judged: string[] = []) {
  return db.turn.findFirst({ where: { ...unjudgedTurns(conversationId), id: { notIn: judged } }, orderBy: { firstSeq: "asc" }, select: { firstSeq: true, createdAt: true } });
}

/**
 * The gate on each of a conversation's turns not yet judged, in order, up to `through` (a turn's
 * own job) or all of them (the conversation's gate job), and what they ask to forget; then
 * extraction, read now if any of them is worth remembering, batch after batch while there is
 * more. Run under the conversation's gate lease. A turn still in the outbox is taken out first,
 * as its own job does (the round died before writing, or left a forget request here). The gate
 * job leaves one its round may still write (younger than HAND_OFF_MS) to that round, whose one
 * statement writes a batch: the run stops there, so that no later turn overtakes it. A turn's
 * own job takes the earlier turns out itself (whoever claims a turn first writes its snippets:
 * work/outbox.ts), so that it never waits. Extraction reads no message of a turn left unjudged
 * (firstUnjudgedSeq: one the run stopped at, one past `through` or the run's 200, one come meanwhile).
 *
 * A turn that asked to forget is marked judged at once, and those judged before it just before
 * its forget; the others once extraction has run or failed (not when its lease was busy). So a
 * retry (a busy lease, an unreadable answer, a model outage on a later turn) never judges a turn
 * again whose stored verdict a forget took, and judges the others from their stored verdicts,
 * with no model call; a retry after a failed extraction (`retry`) extracts again. `again`: turns
 * of the conversation still unjudged at the end (young ones, later ones, or come during the run).
 */
async function judgeInOrder(
  db: TenantDb,
  deps: TurnWorkDeps,
  conversation: ConversationOf,
  { through, retry = false, stillAlive = async () => {} }: JobRunOptions & { through?: TurnRow },
) {
  const turns = await db.turn.findMany({
    where: { ...unjudgedTurns(conversation.id), ...(through && { firstSeq: { lte: through.firstSeq } }) },
    orderBy: { firstSeq: "asc" },
    select: { ...turnFields, createdAt: true },
    take: PER_RUN,
  });
  const youngSince = new Date(Date.now() - HAND_OFF_MS);
  const judged: Judged[] = [];
  const marked = new Set<string>();
  for (const turn of turns) {
    if (!through && !turn.followUpsQueuedAt && turn.createdAt > youngSince) break;
    const row = { ...turn, endUserId: conversation.endUserId };
    if (!turn.followUpsQueuedAt) await dispatchTurn(db, deps, row, conversation);
    const one = await judgeTurn(db, deps, row, conversation);
    if (one.status === "JUDGED" && one.verdict.forget !== "NONE") {
      const before = judged.filter((j) => j.status !== "FORGOT" && !marked.has(j.turnId)).map((j) => j.turnId);
      await markGated(db, before);
      for (const id of before) marked.add(id);
      judged.push(await forgetAsked(db, deps, turn, conversation, one.verdict));
      marked.add(turn.id);
    } else judged.push(one);
  }
  const remember = judged.some((j) => j.status === "JUDGED" && j.verdict.remember);
  const rest = judged.map((j) => j.turnId).filter((id) => !marked.has(id));
  // A retry after a failed extraction (an unreadable answer, an outage) extracts again, and
  // reads now, even with nothing new to judge.
  const extract = conversation.settings.extractionOn && (judged.length > 0 || retry);
  let extraction;
  try {
    if (extract) {
      const beforeSeq = await firstUnjudgedSeq(db, conversation.id, judged.map((j) => j.turnId));
      extraction = await extractAfterGate(db, deps, conversation.id, { now: remember || retry, beforeSeq }, stillAlive);
    }
  } catch (error) {
    // The gate's part is done whatever extraction did; only a busy extraction lease leaves the
    // turns unmarked, for the run that follows at once to judge them again from their stored
    // verdicts and so know again whether to read now. Turns marked (before a forget, or here on a
    // failed extraction) are not judged again, so that one of them asked to read now is kept by
    // the quiet-period job, due in a moment: not only by this job's count of failures, which a
    // retry that finds the lease busy, or a hand-over to the conversation's next gate job, resets.
    const asksToRead = (turnIds: Set<string>) => judged.some((j) => turnIds.has(j.turnId) && j.status === "JUDGED" && j.verdict.remember);
    const failed = !(error instanceof ExtractionBusy);
    if (failed) await markGated(db, rest);
    if (asksToRead(marked) || (failed && asksToRead(new Set(rest)))) {
      await deps.queue.enqueueCoalesced(quietExtractJob, { tenantId: db.$tenantId(), conversationId: conversation.id }, "conversationId", HAND_OFF_MS);
    }
    throw error;
  }
  await markGated(db, rest);
  return { judged, extraction, again: (await firstUnjudgedSeq(db, conversation.id)) !== undefined };
}

/**
 * A turn's follow-ups on its own, in the worker (imports, forget requests of agents that do not
 * extract, turns the dispatcher caught up, jobs queued by an earlier version): out of the outbox
 * if it is still there (its snippets, the conversation's work), then, under the conversation's
 * gate lease, the gate on the conversation's earlier turns not yet judged and on this one, in
 * order, what they ask to forget, and extraction (judgeInOrder). An imported conversation is
 * extracted until caught up instead. A turn already judged (by the conversation's gate job, say)
 * is not judged again: whoever judged it extracted, but a retry of this job after its own
 * extraction failed (`retry`) extracts again, and reads now. Turns still unjudged at the end
 * (come while this job held the lease, whose gate job found it busy and ended) get the
 * conversation's gate job.
 */
export async function runTurnWork(
  db: TenantDb,
  deps: TurnWorkDeps,
  payload: z.infer<typeof turnJob.schema>,
  options: JobRunOptions = {},
) {
  const turn = await db.turn.findUnique({ where: { id: payload.turnId }, select: turnFields });
  const conversation = turn && (await conversationOf(db, turn.conversationId));
  if (!turn || !conversation) return { status: "GONE" as const };
  const row = { ...turn, endUserId: conversation.endUserId };
  if (!turn.followUpsQueuedAt) await dispatchTurn(db, deps, row, conversation);
  if (turn.clientTurnId.startsWith("import:")) return { status: "QUEUED" as const };

  const run = await underGateLease(db, conversation.id, async () => {
    const now = await db.turn.findUnique({ where: { id: turn.id }, select: { gatedAt: true } });
    if (now?.gatedAt) {
      const said = await userMessageOf(db, conversation.id, turn);
      const verdict = said && (await storedGateVerdict(db, { conversationId: conversation.id, message: said.content }));
      const again = (await firstUnjudgedSeq(db, conversation.id)) !== undefined;
      return { own: { turnId: turn.id, status: "JUDGED_BEFORE" as const, verdict }, extraction: undefined, again };
    }
    const done = await judgeInOrder(db, deps, conversation, { ...options, through: row });
    const own = done.judged.find((j) => j.turnId === turn.id);
    if (!own) throw new TurnBusy(); // more than a run's worth of earlier turns: the rest next time
    return { own, extraction: done.extraction, again: done.again };
  });
  if (!("own" in run)) return { status: run.status };
  if (run.again) await deps.queue.enqueueSoon(conversationTurnsJob, { tenantId: db.$tenantId(), conversationId: conversation.id }, "conversationId", HAND_OFF_MS);
  const { own } = run;
  if (own.status === "NO_USER_MESSAGE") return { status: own.status };
  if (own.status === "FORGOT") return { status: "FORGOT" as const, verdict: own.verdict, forgotten: own.forgotten };
  const { verdict } = own;
  if (!conversation.settings.extractionOn) return { status: "DONE" as const, verdict, extraction: { status: "EXTRACTION_OFF" as const } };
  if (run.extraction || !options.retry) return { status: "DONE" as const, verdict, extraction: run.extraction };
  const beforeSeq = await firstUnjudgedSeq(db, conversation.id);
  return { status: "DONE" as const, verdict, extraction: await extractAfterGate(db, deps, conversation.id, { now: true, beforeSeq }, options.stillAlive) };
}

/**
 * The model's part of a conversation's new turns (work/follow-ups.ts queues it once a round has
 * read them): judgeInOrder over all of its turns not yet judged, under its gate lease. BUSY:
 * another runner holds the lease; its own end, or the dispatcher a minute on, finds what is left.
 */
export async function runConversationTurnsWork(
  db: TenantDb,
  deps: TurnWorkDeps,
  payload: z.infer<typeof conversationTurnsJob.schema>,
  options: JobRunOptions = {},
) {
  const conversation = await conversationOf(db, payload.conversationId);
  if (!conversation) return { status: "GONE" as const, again: false };
  const run = await underConversationLease(db, conversation.id, "gateLeaseUntil", () =>
    judgeInOrder(db, deps, conversation, options),
  );
  // Another runner is judging the conversation: its own end looks for turns left (`again`), and
  // the dispatcher for any still unjudged a minute on, so this job need not try again.
  if (!("judged" in run)) return { status: run.status, again: false };
  return { status: "DONE" as const, turns: run.judged.map((j) => j.status), extraction: run.extraction, again: run.again };
}

/**
 * Extraction after the gate: read now when a turn is worth remembering, else when a batch is
 * full; batch after batch while there is more (one extraction reads at most 40 messages, and a
 * conversation's job may come after many turns). `stillAlive` keeps the job's lock between them.
 */
async function extractAfterGate(
  db: TenantDb,
  deps: TurnWorkDeps,
  conversationId: string,
  options: { now: boolean; beforeSeq?: number },
  stillAlive: () => Promise<unknown> = async () => {},
) {
  let extraction: ExtractionResult | { status: "MODEL_OFF" } = await runExtraction(db, deps, conversationId, options);
  for (let rounds = 1; extraction.status === "EXTRACTED" && rounds < 1_000; rounds++) {
    await stillAlive();
    const more = await runExtraction(db, deps, conversationId, options);
    if (more.status === "NOTHING_NEW" || more.status === "WAITING") break; // caught up
    extraction = more;
  }
  return extraction;
}

/**
 * Extraction until caught up, for imported conversations (up to a live turn the gate has not
 * judged); `stillAlive` keeps the job's lock between rounds.
 */
export async function runExtractAll(
  db: TenantDb,
  deps: TurnWorkDeps,
  payload: z.infer<typeof extractJob.schema>,
  stillAlive: () => Promise<unknown> = async () => {},
) {
  for (let rounds = 0; rounds < 1_000; rounds++) {
    const result = await runExtraction(db, deps, payload.conversationId, { now: true, beforeSeq: await firstUnjudgedSeq(db, payload.conversationId) });
    if (result.status !== "EXTRACTED") return result;
    await stillAlive();
  }
}

// The longest a quiet-period job held back by a turn the gate has not judged waits to look again.
export const QUIET_RECHECK_MAX_MS = 5 * 60_000;

/**
 * The quiet-period timer fired: whatever the extractor has not read yet, it reads now, up to a
 * turn the gate has not judged (and if a message came while it ran, the timer is set again). `again`: such a turn held it back, so the job runs again for the
 * rest (the gate job reads now only what is worth remembering): in `againInMs`, a moment later
 * while the gate is only behind, and as long as that turn has waited when it has waited longer
 * (the gate's model is out, say), so that a conversation held back for minutes is looked at a
 * few times, not every few seconds (up to QUIET_RECHECK_MAX_MS).
 */
export async function runQuietExtraction(db: TenantDb, deps: TurnWorkDeps, payload: z.infer<typeof quietExtractJob.schema>) {
  const held = await firstUnjudged(db, payload.conversationId);
  const result = await runExtraction(db, deps, payload.conversationId, { now: true, beforeSeq: held?.firstSeq });
  if (held) return { ...result, again: true, againInMs: Math.min(Math.max(HAND_OFF_MS, Date.now() - held.createdAt.getTime()), QUIET_RECHECK_MAX_MS) };
  // A message said while this ran set the timer again on this very job, and that request is kept
  // (src/agenda-queue.ts) but for one made between the lock and the start's save: the timer is
  // set again here, for the agent's quiet period from now, whichever it was.
  const quietAgainIn = result.status === "EXTRACTED" || result.status === "NOTHING_NEW" ? await quietPeriodIfUnread(db, payload.conversationId) : undefined;
  return { ...result, again: quietAgainIn !== undefined, againInMs: quietAgainIn };
}

/** The agent's quiet period, if the conversation has a shared message the extractor has not read. */
async function quietPeriodIfUnread(db: TenantDb, conversationId: string) {
  const conversation = await db.conversation.findUnique({ where: { id: conversationId }, select: { extractedThroughSeq: true, agent: { select: { settings: true } } } });
  if (!conversation) return undefined;
  const { quietExtractionSeconds } = agentSettings(conversation.agent);
  const unread = await db.message.count({
    where: { conversationId, private: false, forgottenAt: null, seq: { gt: conversation.extractedThroughSeq } },
    take: 1,
  });
  return unread && quietExtractionSeconds > 0 ? quietExtractionSeconds * 1_000 : undefined;
}
