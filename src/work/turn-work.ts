import type { z } from "zod";
import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { agentSettings, type AgentSettings } from "../memory/conversations/agents.ts";
import { extractFacts, type ExtractionResult } from "../memory/facts/extraction.ts";
import { forgetPhrases, forgetUser } from "../memory/forget.ts";
import { gateMessage, type StoredVerdict } from "../memory/gate/gate.ts";
import { extractJob, quietExtractJob, type conversationTurnsJob, type turnJob } from "../queue.ts";
import { UnreadableAnswer } from "./dead-letter.ts";
import { indexFactKeys, makeTurnSnippets, queueIndexing } from "./index-snippets.ts";
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

/**
 * A turn's follow-ups, in the worker: its messages become recall snippets (written here, embedded
 * by the index job), the summary rewrite is requested, and the turn is marked as dispatched (the outbox).
 * Then the gate's verdict on the user's message (the one the caller or context assembly already
 * gave, or a new one), forgetting what the user asked to forget, and extraction when the gate
 * says the turn is worth remembering or a batch is full. An imported conversation is extracted
 * until caught up instead.
 */
export async function runTurnWork(db: TenantDb, deps: TurnWorkDeps, payload: z.infer<typeof turnJob.schema>) {
  const gated = await gateTurn(db, deps, payload.turnId);
  if (gated.status !== "GATED") return gated;
  const { verdict } = gated;
  if (!gated.extractionOn) return { status: "DONE" as const, verdict, extraction: { status: "EXTRACTION_OFF" as const } };
  return { status: "DONE" as const, verdict, extraction: await extractAfterGate(db, deps, gated.conversationId, verdict.remember) };
}

/**
 * The model's part of a conversation's turns that a follow-ups round dispatched (work/follow-ups.ts,
 * which wrote their snippets and queued the conversation's summary request and timer): the gate
 * on each turn's user message, in order (and what it asks to forget), then one extraction, read
 * now if any of them is worth remembering. A turn the round did not get to write (it died after
 * queueing this) has its whole follow-ups done here, as runTurnWork does them.
 */
export async function runConversationTurnsWork(db: TenantDb, deps: TurnWorkDeps, payload: z.infer<typeof conversationTurnsJob.schema>) {
  const turns: Gated[] = [];
  for (const turnId of payload.turnIds) turns.push(await gateTurn(db, deps, turnId));
  const gated = turns.filter((t): t is Extract<Gated, { status: "GATED" }> => t.status === "GATED" && t.extractionOn);
  const statuses = turns.map((t) => t.status);
  if (gated.length === 0) return { status: "DONE" as const, turns: statuses };
  const remember = gated.some((t) => t.verdict.remember);
  return { status: "DONE" as const, turns: statuses, extraction: await extractAfterGate(db, deps, payload.conversationId, remember) };
}

type Gated =
  | { status: "GONE" | "QUEUED" | "NO_USER_MESSAGE" }
  | { status: "FORGOT"; verdict: StoredVerdict; forgotten: unknown }
  | { status: "GATED"; verdict: StoredVerdict; conversationId: string; extractionOn: boolean };

/** A turn's follow-ups up to extraction: its snippets and the conversation's work if it is still in the outbox, then the gate. */
async function gateTurn(db: TenantDb, deps: TurnWorkDeps, turnId: string): Promise<Gated> {
  const tenantId = db.$tenantId();
  const turn = await db.turn.findUnique({
    where: { id: turnId },
    include: { conversation: { select: { id: true, endUserId: true, agent: { select: { settings: true } } } } },
  });
  if (!turn) return { status: "GONE" };
  const { conversation } = turn;
  const settings = agentSettings(conversation.agent);
  const imported = turn.clientTurnId.startsWith("import:");

  if (!turn.followUpsQueuedAt) {
    // The snippets are written here, before the gate, and only embedded by the index job: a forget
    // request's own snippet then exists when this job forgets (below), and an index job making it
    // later, or while the forget runs, cannot bring back what was just forgotten.
    const made = await makeTurnSnippets(db, deps, conversation.id, { firstSeq: turn.firstSeq, lastSeq: turn.lastSeq });
    await queueIndexing(deps, tenantId, made);
    await queueConversationWork(deps, tenantId, conversation.id, settings, { imported });
    await db.turn.updateMany({ where: { id: turn.id }, data: { followUpsQueuedAt: new Date() } });
  }
  if (imported) return { status: "QUEUED" };

  const userMessage = await db.message.findFirst({
    where: { conversationId: conversation.id, seq: turn.firstSeq, role: "USER", forgottenAt: null },
    select: { id: true, content: true },
  });
  if (!userMessage) return { status: "NO_USER_MESSAGE" };
  // With extraction off, only the keyword gate runs: it still honours "forget …" requests, and no
  // model call is spent on a verdict nobody would use.
  const verdict = await gateMessage(
    db,
    { triage: settings.extractionOn ? await chainFor(deps.models, tenantId, "triage") : null, log: deps.log },
    { conversationId: conversation.id, messageId: userMessage.id, message: userMessage.content },
  );
  if (verdict.forget !== "NONE") {
    const who = { reason: "the user asked to forget", conversationId: conversation.id };
    const forgotten =
      verdict.forget === "ALL"
        ? await forgetUser(db, deps, conversation.endUserId, { ...who, reason: "the user asked to forget everything" })
        : await forgetPhrases(db, deps, conversation.endUserId, verdict.forgetTargets, who);
    return { status: "FORGOT", verdict, forgotten };
  }
  return { status: "GATED", verdict, conversationId: conversation.id, extractionOn: settings.extractionOn };
}

/** Extraction after the gate: read now when a turn is worth remembering, else when a batch is full. */
async function extractAfterGate(db: TenantDb, deps: TurnWorkDeps, conversationId: string, remember: boolean) {
  const extraction: ExtractionResult | { status: "MODEL_OFF" } = await runExtraction(db, deps, conversationId, remember);
  // Another extraction of this conversation is running and may not have read these turns. One
  // worth remembering tries again later (the gate's verdicts are stored, so the retry costs no
  // second gate call); any other waits for the batch, which the conversation's next turn or its
  // quiet-period timer looks at again. Turns of one conversation arriving together had their jobs
  // retried in turn on the lease, a third of the embedded store's statements under such load.
  if (extraction.status === "BUSY" && remember) throw new ExtractionBusy();
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
