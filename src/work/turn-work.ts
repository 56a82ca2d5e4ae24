import type { z } from "zod";
import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { agentSettings, type AgentSettings } from "../memory/conversations/agents.ts";
import { extractFacts, type ExtractionResult } from "../memory/facts/extraction.ts";
import { forgetPhrases, forgetUser } from "../memory/forget.ts";
import { gateMessage, storedGateVerdict, type StoredVerdict } from "../memory/gate/gate.ts";
import { planSnippetsOfTurns, type TurnRange } from "../memory/recall/snippets.ts";
import { extractJob, quietExtractJob, type conversationTurnsJob, type turnJob } from "../queue.ts";
import { UnreadableAnswer } from "./dead-letter.ts";
import { factKeysOf, indexFactKeys, queueIndexing } from "./index-snippets.ts";
import { markGated, takeFromOutbox } from "./outbox.ts";
import { requestSummary } from "./summarize.ts";

type TurnWorkDeps = Pick<Deps, "models" | "queue" | "pubsub" | "vectors" | "embeddings" | "log">;

async function runExtraction(db: TenantDb, deps: TurnWorkDeps, conversationId: string, now: boolean) {
  const tenantId = db.$tenantId();
  const [extractor, judge] = await Promise.all([
    chainFor(deps.models, tenantId, "extract"),
    chainFor(deps.models, tenantId, "fact-judge"),
  ]);
  if (!extractor || !judge) return { status: "MODEL_OFF" as const };
  const result = await extractFacts(
    db,
    { extractor, judge, pubsub: deps.pubsub, vectors: deps.vectors, log: deps.log },
    conversationId,
    { now },
  );
  if (result.status === "EXTRACTED" && result.outcomes.some((o) => o.factId && o.change !== "REFRESHED")) {
    await indexFactKeys(db, deps, conversationId);
  }
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

/** Another worker's statement holds the turn in the outbox this moment: the job runs again soon (jobs/turn.ts). */
export class TurnBusy extends Error {
  constructor() {
    super("another worker is taking this turn out of the outbox; retrying later");
    this.name = "TurnBusy";
  }
}

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

/**
 * The gate on a turn's user message (the verdict the caller or context assembly gave, else a new
 * one: the model's where the agent extracts, the keywords' elsewhere), and what it asks to
 * forget. A turn that asked to forget is marked judged at once: a retry of the job must not judge
 * it again, since the forget took the stored verdicts with it.
 */
async function judgeTurn(db: TenantDb, deps: TurnWorkDeps, turn: TurnRow, conversation: ConversationOf): Promise<Judged> {
  const userMessage = await db.message.findFirst({
    where: { conversationId: conversation.id, seq: turn.firstSeq, role: "USER", forgottenAt: null },
    select: { id: true, content: true },
  });
  if (!userMessage) return { turnId: turn.id, status: "NO_USER_MESSAGE" };
  const triage = conversation.settings.extractionOn ? await chainFor(deps.models, db.$tenantId(), "triage") : null;
  const verdict = await gateMessage(db, { triage, log: deps.log }, { conversationId: conversation.id, messageId: userMessage.id, message: userMessage.content });
  if (verdict.forget === "NONE") return { turnId: turn.id, status: "JUDGED", verdict };
  const who = { reason: "the user asked to forget", conversationId: conversation.id };
  const forgotten =
    verdict.forget === "ALL"
      ? await forgetUser(db, deps, conversation.endUserId, { ...who, reason: "the user asked to forget everything" })
      : await forgetPhrases(db, deps, conversation.endUserId, verdict.forgetTargets, who);
  await markGated(db, [turn.id]);
  return { turnId: turn.id, status: "FORGOT", verdict, forgotten };
}

/**
 * A turn's follow-ups on its own, in the worker (imports, forget requests of agents that do not
 * extract, turns the dispatcher caught up, jobs queued by an earlier version): out of the outbox
 * if it is still there (its snippets, the conversation's work), then the gate and what it asks to
 * forget, then extraction when the gate says the turn is worth remembering or a batch is full.
 * An imported conversation is extracted until caught up instead. A turn already judged is not
 * judged again: its stored verdict, if any, says whether extraction reads now.
 */
export async function runTurnWork(
  db: TenantDb,
  deps: TurnWorkDeps,
  payload: z.infer<typeof turnJob.schema>,
  stillAlive: () => Promise<unknown> = async () => {},
) {
  const turn = await db.turn.findUnique({ where: { id: payload.turnId }, select: turnFields });
  const conversation = turn && (await conversationOf(db, turn.conversationId));
  if (!turn || !conversation) return { status: "GONE" as const };
  if (!turn.followUpsQueuedAt) await dispatchTurn(db, deps, { ...turn, endUserId: conversation.endUserId }, conversation);
  if (turn.clientTurnId.startsWith("import:")) return { status: "QUEUED" as const };

  let verdict: StoredVerdict | null;
  if (turn.gatedAt) {
    const said = await db.message.findFirst({ where: { conversationId: conversation.id, seq: turn.firstSeq, role: "USER", forgottenAt: null }, select: { content: true } });
    verdict = said && (await storedGateVerdict(db, { conversationId: conversation.id, message: said.content }));
  } else {
    const judged = await judgeTurn(db, deps, { ...turn, endUserId: conversation.endUserId }, conversation);
    if (judged.status === "FORGOT") return { status: "FORGOT" as const, verdict: judged.verdict, forgotten: judged.forgotten };
    await markGated(db, [turn.id]);
    if (judged.status === "NO_USER_MESSAGE") return { status: "NO_USER_MESSAGE" as const };
    verdict = judged.verdict;
  }
  if (!conversation.settings.extractionOn) return { status: "DONE" as const, verdict, extraction: { status: "EXTRACTION_OFF" as const } };
  return { status: "DONE" as const, verdict, extraction: await extractAfterGate(db, deps, conversation.id, Boolean(verdict?.remember), stillAlive) };
}

// Turns judged per run of a conversation's job.
const PER_RUN = 200;

/**
 * A conversation's gate job runs this long after the last round that asked for it (by when those
 * rounds have written their turns: queue writes took hundreds of milliseconds each on the
 * embedded store under load), and again this long after a run that left turns unjudged. A turn
 * still in the outbox is the round's for this long; after it, the job takes it out itself.
 */
export const HAND_OFF_MS = 5_000;

/**
 * The model's part of a conversation's new turns (work/follow-ups.ts queues it, coalesced per
 * conversation, once a round has read them): the gate on each turn not yet judged, in order (and
 * what it asks to forget), then one extraction, read now if any of them is worth remembering. A
 * turn still in the outbox (the round died before writing, or left a forget request here) is
 * taken out first, as runTurnWork does. A turn that asked to forget is marked judged at once, the
 * others once extraction has run, so a retry (a busy lease, an unreadable answer, a model outage
 * on a later turn) never judges a forget request twice, and judges the others from their stored
 * verdicts. `again`: turns still
 * unjudged when it ends (they came during the run; the request a round made meanwhile went to
 * this running job's row), for the job to run again.
 */
export async function runConversationTurnsWork(
  db: TenantDb,
  deps: TurnWorkDeps,
  payload: z.infer<typeof conversationTurnsJob.schema>,
  stillAlive: () => Promise<unknown> = async () => {},
) {
  const conversation = await conversationOf(db, payload.conversationId);
  if (!conversation) return { status: "GONE" as const, again: false };
  const unjudged = { conversationId: conversation.id, gatedAt: null, NOT: { clientTurnId: { startsWith: "import:" } } };
  const turns = await db.turn.findMany({
    where: { ...unjudged, OR: [{ followUpsQueuedAt: { not: null } }, { createdAt: { lt: new Date(Date.now() - HAND_OFF_MS) } }] },
    orderBy: { firstSeq: "asc" },
    select: turnFields,
    take: PER_RUN,
  });
  const judged: Judged[] = [];
  for (const turn of turns) {
    const row = { ...turn, endUserId: conversation.endUserId };
    if (!turn.followUpsQueuedAt) await dispatchTurn(db, deps, row, conversation);
    judged.push(await judgeTurn(db, deps, row, conversation));
  }
  const remember = judged.some((j) => j.status === "JUDGED" && j.verdict.remember);
  const extraction = conversation.settings.extractionOn && judged.length ? await extractAfterGate(db, deps, conversation.id, remember, stillAlive) : undefined;
  // Those that forgot are marked already; the rest once extraction has run (a retry before this,
  // on a busy lease say, judges them again from their stored verdicts, without a model call, and
  // so knows again whether extraction reads now).
  await markGated(db, judged.filter((j) => j.status !== "FORGOT").map((j) => j.turnId));
  const again = (await db.turn.count({ where: unjudged })) > 0;
  return { status: "DONE" as const, turns: judged.map((j) => j.status), extraction, again };
}

/**
 * Extraction after the gate: read now when a turn is worth remembering, else when a batch is
 * full; batch after batch while there is more (one extraction reads at most 40 messages, and a
 * conversation's job may come after many turns). `stillAlive` keeps the job's lock between them.
 */
async function extractAfterGate(db: TenantDb, deps: TurnWorkDeps, conversationId: string, remember: boolean, stillAlive: () => Promise<unknown>) {
  let extraction: ExtractionResult | { status: "MODEL_OFF" } = await runExtraction(db, deps, conversationId, remember);
  for (let rounds = 1; extraction.status === "EXTRACTED" && rounds < 1_000; rounds++) {
    await stillAlive();
    const more = await runExtraction(db, deps, conversationId, remember);
    if (more.status === "NOTHING_NEW" || more.status === "WAITING") break; // caught up
    extraction = more;
  }
  // Another extraction of this conversation is running and may not have read these turns: try
  // again later (the gate's verdicts are stored and the turns marked judged, so the retry costs no
  // second gate call). Not only for a turn worth remembering: one that fills a batch has no other
  // reader when the agent's quiet-period timer is off.
  if (extraction.status === "BUSY") throw new ExtractionBusy();
  if (extraction.status === "UNPARSABLE") throw new UnreadableAnswer("fact extraction");
  return extraction;
}

/** Extraction until caught up, for imported conversations; `stillAlive` keeps the job's lock between rounds. */
export async function runExtractAll(
  db: TenantDb,
  deps: TurnWorkDeps,
  payload: z.infer<typeof extractJob.schema>,
  stillAlive: () => Promise<unknown> = async () => {},
) {
  for (let rounds = 0; rounds < 1_000; rounds++) {
    const result = await runExtraction(db, deps, payload.conversationId, true);
    if (result.status === "BUSY") throw new ExtractionBusy();
    if (result.status === "UNPARSABLE") throw new UnreadableAnswer("fact extraction");
    if (result.status !== "EXTRACTED") return result;
    await stillAlive();
  }
}

/** The quiet-period timer fired: whatever the extractor has not read yet, it reads now. */
export async function runQuietExtraction(db: TenantDb, deps: TurnWorkDeps, payload: z.infer<typeof quietExtractJob.schema>) {
  const result = await runExtraction(db, deps, payload.conversationId, true);
  if (result.status === "BUSY") throw new ExtractionBusy();
  if (result.status === "UNPARSABLE") throw new UnreadableAnswer("fact extraction");
  return result;
}
