import type { z } from "zod";
import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { agentSettings, type AgentSettings } from "../memory/conversations/agents.ts";
import { extractFacts, type ExtractionResult } from "../memory/facts/extraction.ts";
import { forgetPhrases, forgetUser } from "../memory/forget.ts";
import { gateMessage } from "../memory/gate/gate.ts";
import { extractJob, quietExtractJob, type turnJob } from "../queue.ts";
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
 * until caught up instead. A turn the batched follow-ups already dispatched (work/follow-ups.ts,
 * which wrote its snippet and queued the conversation's work) comes here for the gate and
 * extraction alone.
 */
export async function runTurnWork(db: TenantDb, deps: TurnWorkDeps, payload: z.infer<typeof turnJob.schema>) {
  const tenantId = db.$tenantId();
  const turn = await db.turn.findUnique({
    where: { id: payload.turnId },
    include: { conversation: { select: { id: true, endUserId: true, agent: { select: { settings: true } } } } },
  });
  if (!turn) return { status: "GONE" as const };
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
  if (imported) return { status: "QUEUED" as const };

  const userMessage = await db.message.findFirst({
    where: { conversationId: conversation.id, seq: turn.firstSeq, role: "USER", forgottenAt: null },
    select: { id: true, content: true },
  });
  if (!userMessage) return { status: "NO_USER_MESSAGE" as const };
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
    return { status: "FORGOT" as const, verdict, forgotten };
  }
  if (!settings.extractionOn) return { status: "DONE" as const, verdict, extraction: { status: "EXTRACTION_OFF" as const } };
  const extraction: ExtractionResult | { status: "MODEL_OFF" } = await runExtraction(db, deps, conversation.id, verdict.remember);
  // Another extraction of this conversation is running and may not have read this turn: try again
  // later (the gate's verdict is stored, so the retry costs no second gate call). Not only for a
  // turn worth remembering: one that fills a batch has no other reader when the agent's
  // quiet-period timer is off.
  if (extraction.status === "BUSY") throw new ExtractionBusy();
  if (extraction.status === "UNPARSABLE") throw new UnreadableAnswer("fact extraction");
  return { status: "DONE" as const, verdict, extraction };
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
