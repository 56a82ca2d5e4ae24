import { appNow, type TenantDb } from "../db.ts";
import { Prisma, type GateVerdict } from "../generated/prisma/client.ts";
import type { Deps } from "../deps.ts";
import { agentSettings, type AgentSettings } from "../memory/conversations/agents.ts";
import { gateByKeywords } from "../memory/gate/gate.ts";
import { indexSnippets, insertTurnSnippets, planSnippetsOfTurns, syncFactKeys, type SnippetRow, type TurnRange } from "../memory/recall/snippets.ts";
import { indexJob, turnJob } from "../queue.ts";
import { queueConversationWork } from "./turn-work.ts";

type FollowUpsDeps = Pick<Deps, "queue" | "embeddings" | "vectors" | "log">;

// Turns claimed per round.
const PER_ROUND = 200;
// Snippets per embedding call and Chroma upsert.
const PER_EMBEDDING = 128;

/**
 * The outbox of new turns, drained in batches: each round of up to 200 turns, of any
 * conversations, reads what it needs (the turns with their agents' settings, their messages, the
 * snippets and verdicts they have), then writes their TURN snippets and the keyword gate's
 * verdicts and marks them dispatched in one statement (writeRound); then the round's snippets are
 * embedded together and upserted in one call. No transaction is held across round trips: on the
 * embedded store an open transaction has the database's one session to itself, and every
 * recordTurn waited behind the round's nine statements. A turn whose verdict forgets something is
 * left in the outbox for its own turn job, which makes its snippet and forgets.
 *
 * What calls a model is queued before the round's write, so a crash between the two loses none
 * of it: each conversation's summary request and quiet-period timer once per round (not once per
 * turn), and for a turn whose agent extracts facts its own turn job, which finds the turn
 * dispatched and runs only the model's gate and extraction (runTurnWork). That job waits
 * HAND_OFF_DELAY_MS, by when the round has written; were the round to die first, the job does the
 * whole of the turn's follow-ups itself, as for a turn the round never saw.
 */
export async function runTurnFollowUps(db: TenantDb, deps: FollowUpsDeps, stillAlive: () => Promise<unknown> = async () => {}) {
  const tenantId = db.$tenantId();
  const handedOff: string[] = [];
  let turns = 0;
  let indexed = 0;
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
    await queueModelWork(deps, tenantId, waiting.filter((t) => !forgets.has(t.id)), gated);
    const written = await writeRound(db, {
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
    });
    const claimed = new Set(written.claimed);
    const ofRound = waiting.filter((t) => claimed.has(t.id));
    turns += ofRound.length;
    // Still in the outbox: were this enqueue lost, the dispatcher would queue their job. Coalesced
    // per turn, since another round may find the turn again before its job has marked it.
    const handing = forgetting.filter((id) => claimed.has(id));
    for (const turnId of handing) await deps.queue.enqueueCoalesced(turnJob, { tenantId, turnId }, "turnId", 1_000);
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
    // Extraction may have read these messages before their turn had a snippet: the keys of its
    // facts could not point anywhere yet.
    if (messageIds.length && (await db.fact.count({ where: { sourceMessageId: { in: messageIds } } }))) {
      for (const endUserId of new Set(ofRound.map((t) => t.endUserId))) ids.push(...(await syncFactKeys(db, deps, endUserId)));
    }
    for (let i = 0; i < ids.length; i += PER_EMBEDDING) {
      const batch = ids.slice(i, i + PER_EMBEDDING);
      try {
        indexed += (await indexSnippets(db, deps, batch)).indexed;
      } catch (error) {
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
 * A turn job waits this long, by when the round that queued it has written its turn: one that
 * found the turn still in the outbox would make its snippet beside the round's write. Queue
 * writes took hundreds of milliseconds each on the embedded store under load.
 */
const HAND_OFF_DELAY_MS = 5_000;

/**
 * The model's work of a round's turns (all but the forget requests, which get a turn job of their
 * own): a summary request and the quiet-period timer per conversation, and a turn job for each
 * turn whose agent extracts (its gate and extraction; runTurnWork skips what the round does).
 */
async function queueModelWork(
  deps: FollowUpsDeps,
  tenantId: string,
  turns: { id: string; conversationId: string; settings: AgentSettings }[],
  gated: { id: string }[],
) {
  const conversations = new Map(turns.map((t) => [t.conversationId, t.settings]));
  for (const [conversationId, settings] of conversations) await queueConversationWork(deps, tenantId, conversationId, settings, { imported: false });
  // A turn without a user message has no verdict to ask for.
  const withMessage = new Set(gated.map((t) => t.id));
  for (const turn of turns) {
    if (turn.settings.extractionOn && withMessage.has(turn.id)) {
      await deps.queue.enqueue(turnJob, { tenantId, turnId: turn.id }, { delayMs: HAND_OFF_DELAY_MS });
    }
  }
}

type RoundRows = {
  turnIds: string[];
  snippets: (SnippetRow & { turnId: string })[];
  /** Each with the id of the message it judged: written only while that message is not forgotten. */
  verdicts: (Omit<GateVerdict, "id" | "tenantId" | "createdAt"> & { turnId: string; messageId: string })[];
  forgetting: string[];
};

/**
 * A round's writes in one statement (atomic on its own): it claims those of the turns still in
 * the outbox (SKIP LOCKED, so two workers never take the same turn; a turn another worker
 * dispatched meanwhile is no longer waiting), inserts the snippets (of messages not forgotten
 * meanwhile: insertTurnSnippets) and verdicts (of messages not forgotten meanwhile either) of the
 * claimed turns, and marks them dispatched, except those left for their own turn job. Returns the
 * claimed turns' ids and the new snippets'.
 */
export async function writeRound(db: TenantDb, rows: RoundRows): Promise<{ claimed: string[]; snippetIds: string[] }> {
  const tenantId = db.$tenantId();
  const now = appNow();
  const [written] = await db.$queryRaw<{ claimed: string[]; snippetIds: string[] }[]>`
    WITH claimed AS (
      SELECT "id" FROM "Turn"
      WHERE "tenantId" = ${tenantId} AND "id" = ANY(${rows.turnIds}::text[]) AND "followUpsQueuedAt" IS NULL
      FOR UPDATE SKIP LOCKED
    ), ${insertTurnSnippets(tenantId, rows.snippets, Prisma.sql`AND r."turnId" IN (SELECT "id" FROM claimed)`, rows.verdicts.map((v) => v.messageId))}, verdicts AS (
      INSERT INTO "GateVerdict" ("id", "tenantId", "conversationId", "messageHash", "remember", "forget", "forgetTargets", "needsRecall", "decidedBy", "createdAt")
      SELECT gen_random_uuid()::text, ${tenantId}, v."conversationId", v."messageHash", v."remember", v."forget", v."forgetTargets", v."needsRecall", v."decidedBy", ${now}
      FROM jsonb_to_recordset(${JSON.stringify(rows.verdicts)}::jsonb)
        AS v("turnId" text, "messageId" text, "conversationId" text, "messageHash" text, "remember" boolean, "forget" text, "forgetTargets" text[], "needsRecall" boolean, "decidedBy" text)
      WHERE v."turnId" IN (SELECT "id" FROM claimed) AND v."messageId" IN (SELECT "id" FROM "live")
      ON CONFLICT ("conversationId", "messageHash") DO NOTHING
    ), marked AS (
      UPDATE "Turn" SET "followUpsQueuedAt" = ${now}
      WHERE "id" IN (SELECT "id" FROM claimed) AND NOT ("id" = ANY(${rows.forgetting}::text[]))
    )
    SELECT coalesce((SELECT array_agg("id") FROM claimed), '{}') AS "claimed",
           coalesce((SELECT array_agg("id") FROM "inserted"), '{}') AS "snippetIds"`;
  return written;
}
