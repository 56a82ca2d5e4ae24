import type { TenantDb } from "../db.ts";
import type { Prisma } from "../generated/prisma/client.ts";
import type { Deps } from "../deps.ts";
import { isBudgetExhausted } from "../governance/budget.ts";
import { agentSettings, type AgentSettings } from "../memory/conversations/agents.ts";
import { gateByKeywords } from "../memory/gate/gate.ts";
import { indexSnippets, planSnippetsOfTurns, type TurnRange } from "../memory/recall/snippets.ts";
import { conversationTurnsJob, indexJob, turnJob } from "../queue.ts";
import { factKeysOf, logIndexingPaused } from "./index-snippets.ts";
import { takeFromOutbox } from "./outbox.ts";
import { HAND_OFF_MS, queueConversationWork } from "./turn-work.ts";

type FollowUpsDeps = Pick<Deps, "queue" | "embeddings" | "vectors" | "log">;

// Turns claimed per round.
const PER_ROUND = 200;
// Snippets per embedding call and Chroma upsert.
const PER_EMBEDDING = 128;

/**
 * The outbox of new turns, drained in batches: each round of up to 200 turns, of any
 * conversations, reads what it needs (the turns with their agents' settings, their messages, the
 * snippets and verdicts they have), then writes their TURN snippets and the keyword gate's
 * verdicts and marks them dispatched in one statement (takeFromOutbox); then the round's snippets
 * are embedded together and upserted in one call. No transaction is held across round trips: on
 * the embedded store an open transaction has the database's one session to itself, and every
 * recordTurn waited behind the round's nine statements. A turn whose verdict forgets something is
 * left in the outbox for the job that makes its snippet and forgets.
 *
 * What calls a model is queued before the round's write, so a crash between the two loses none
 * of it, once per conversation a round (not once per turn): the summary request, the
 * quiet-period timer and, where the agent extracts facts, the conversation's gate job, which
 * judges each of its turns not yet judged, in order, then extracts (runConversationTurnsWork).
 * That job is due HAND_OFF_MS later, by when the round has written; a turn it still finds in the
 * outbox after that (the round died first) it takes out itself, with its snippets, and whichever
 * of the two claims a turn first writes them.
 */
export async function runTurnFollowUps(db: TenantDb, deps: FollowUpsDeps, stillAlive: () => Promise<unknown> = async () => {}) {
  const tenantId = db.$tenantId();
  const handedOff: string[] = [];
  let turns = 0;
  let indexed = 0;
  // Once the budget refuses an embedding, this run embeds no more (each batch would be refused).
  let budgetRefused = false;
  for (let round = 0; round < 1_000; round++) {
    const rows = await db.$queryRaw<(TurnRange & { id: string; agentSettings: Prisma.JsonValue })[]>`
      SELECT t."id", t."conversationId", t."firstSeq", t."lastSeq", c."endUserId", a."settings" AS "agentSettings"
      FROM "Turn" t JOIN "Conversation" c ON c."id" = t."conversationId" JOIN "Agent" a ON a."id" = c."agentId"
      WHERE t."tenantId" = ${tenantId} AND t."followUpsQueuedAt" IS NULL AND t."clientTurnId" NOT LIKE 'import:%'
        AND NOT (t."id" = ANY(${handedOff}::text[]))
      ORDER BY t."createdAt"
      LIMIT ${PER_ROUND}`;
    if (rows.length === 0) break;
    const waiting = rows.map(({ agentSettings: settings, ...turn }) => ({ ...turn, settings: agentSettings({ settings }) }));
    const planned = await planSnippetsOfTurns(db, waiting);
    // The user message that opens each turn, for the gate.
    const opening = new Map(planned.messages.filter((m) => m.role === "USER").map((m) => [`${m.conversationId}:${m.seq}`, m]));
    const openingOf = (t: (typeof waiting)[number]) => opening.get(`${t.conversationId}:${t.firstSeq}`);
    const gated = waiting.filter((t) => openingOf(t));
    const gate = await gateByKeywords(
      db,
      gated.map((t) => ({ conversationId: t.conversationId, message: openingOf(t)!.content })),
    );
    const forgetting = gated.filter((_, i) => gate.verdicts[i].forget !== "NONE").map((t) => t.id);
    const forgets = new Set(forgetting);
    const withMessage = new Set(gated.map((t) => t.id));
    await queueModelWork(deps, tenantId, waiting, withMessage);
    // Judged here: the keyword gate decides where no model does (extraction off), and a turn
    // without a user message has nothing to judge.
    const written = await takeFromOutbox(db, {
      turnIds: waiting.map((t) => t.id),
      // A turn left for its own job gets its snippet there (another worker may claim it again
      // before that job marks it, and a snippet written twice would be a duplicate).
      snippets: planned.rows
        .map(({ turn, ...row }) => ({ ...row, turnId: waiting[turn].id }))
        .filter((row) => !forgets.has(row.turnId)),
      // The keyword gate's verdict stands where no model decides (the agent's extraction is off);
      // elsewhere the model's, in the turn's job (a forget request's too: the model names what to
      // forget).
      verdicts: gate.fresh
        .filter(({ index }) => !gated[index].settings.extractionOn)
        .map(({ index, ...row }) => ({ ...row, turnId: gated[index].id, messageId: openingOf(gated[index])!.id })),
      forgetting,
      gated: waiting.filter((t) => !forgets.has(t.id) && (!t.settings.extractionOn || !withMessage.has(t.id))).map((t) => t.id),
    });
    const claimed = new Set(written.claimed);
    const ofRound = waiting.filter((t) => claimed.has(t.id));
    turns += ofRound.length;
    // Still in the outbox: the conversation's gate job takes those of agents that extract; the
    // others get a turn job (were this enqueue lost, the dispatcher would queue it), coalesced per
    // turn, since another round may find the turn again before its job has marked it.
    const handing = forgetting.filter((id) => claimed.has(id));
    const extracting = new Set(waiting.filter((t) => t.settings.extractionOn).map((t) => t.id));
    for (const turnId of handing.filter((id) => !extracting.has(id))) {
      await deps.queue.enqueueCoalesced(turnJob, { tenantId, turnId }, "turnId", 1_000);
    }
    handedOff.push(...handing);
    const messagesOf = (turns: typeof waiting) =>
      planned.messages
        .filter((m) => turns.some((t) => t.conversationId === m.conversationId && m.seq >= t.firstSeq && m.seq <= t.lastSeq))
        .map((m) => m.id);
    const messageIds = messagesOf(ofRound);
    // Snippets still without a vector of the turns this round took (their turn job made them, a
    // dispatcher's catch-up say): not those of turns another worker took, nor of the forget
    // requests, whose own job embeds what it made.
    const ours = new Set(messagesOf(ofRound.filter((t) => !forgets.has(t.id))));
    const ids = [...planned.waiting.filter((s) => s.messageIds.some((id) => ours.has(id))).map((s) => s.id), ...written.snippetIds];
    ids.push(...(await factKeysOf(db, deps, ofRound.map((t) => t.endUserId), messageIds)));
    for (let i = 0; i < ids.length && !budgetRefused; i += PER_EMBEDDING) {
      const batch = ids.slice(i, i + PER_EMBEDDING);
      try {
        indexed += (await indexSnippets(db, deps, batch)).indexed;
      } catch (error) {
        if (isBudgetExhausted(error)) {
          logIndexingPaused(deps, { tenantId });
          budgetRefused = true;
          break;
        }
        // The embedder or Chroma is out: an index job retries these with its backoff (and the
        // reconcile sweep finds any snippet left without a vector).
        deps.log.warn("could not index a batch of turn snippets now; an index job will retry", { tenantId, error });
        await deps.queue.enqueue(indexJob, { tenantId, snippetIds: batch });
      }
    }
    await stillAlive();
    // Fewer than a round's worth waited, or another worker holds them.
    if (waiting.length < PER_ROUND || ofRound.length === 0) break;
  }
  deps.log.debug("turn follow-ups done", { tenantId, turns, indexed });
  return { turns, indexed };
}

/**
 * The model's work of a round's turns, per conversation: a summary request, the quiet-period
 * timer, and where the agent extracts and a turn has a user message to judge, the conversation's
 * gate job.
 */
async function queueModelWork(
  deps: FollowUpsDeps,
  tenantId: string,
  turns: { id: string; conversationId: string; settings: AgentSettings }[],
  withMessage: Set<string>,
) {
  const conversations = new Map(turns.map((t) => [t.conversationId, t.settings]));
  for (const [conversationId, settings] of conversations) await queueConversationWork(deps, tenantId, conversationId, settings, { imported: false });
  const judging = new Set(turns.filter((t) => t.settings.extractionOn && withMessage.has(t.id)).map((t) => t.conversationId));
  for (const conversationId of judging) {
    // One job per conversation and window from this process, due at the window's end: a
    // conversation that keeps talking is judged every 5 s, not once it falls quiet. Two such jobs
    // (two workers' rounds) take turns on the conversation's gate lease.
    await deps.queue.enqueueSoon(conversationTurnsJob, { tenantId, conversationId }, "conversationId", HAND_OFF_MS);
  }
}

