import { appNow, type TenantDb } from "../db.ts";
import { Prisma, type GateVerdict } from "../generated/prisma/client.ts";
import { insertTurnSnippets, type SnippetRow } from "../memory/recall/snippets.ts";

type OutboxRows = {
  turnIds: string[];
  snippets: (SnippetRow & { turnId: string })[];
  /** Each with the id of the message it judged: written only while that message is not forgotten. */
  verdicts: (Omit<GateVerdict, "id" | "tenantId" | "createdAt"> & { turnId: string; messageId: string })[];
  /** Claimed but left in the outbox, for the job that forgets what they ask. */
  forgetting: string[];
  /** Marked judged as they leave the outbox: no model gate is due (the verdicts above, an import). */
  gated: string[];
};

/**
 * Takes turns out of the outbox with their writes, in one statement (atomic on its own): it
 * claims those of the turns still in the outbox (SKIP LOCKED, so two workers, or a round and a
 * turn's own job, never take the same turn; a turn another one dispatched meanwhile is no longer
 * waiting), inserts the snippets (of messages not forgotten meanwhile: insertTurnSnippets) and
 * verdicts (of messages not forgotten meanwhile either) of the claimed turns, and marks them
 * dispatched, except those left for the job that forgets. Whoever claims a turn writes its
 * snippets; nobody else does. Returns the claimed turns' ids and the new snippets'.
 */
export async function takeFromOutbox(db: TenantDb, rows: OutboxRows): Promise<{ claimed: string[]; snippetIds: string[] }> {
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
      UPDATE "Turn" SET "followUpsQueuedAt" = ${now}, "gatedAt" = CASE WHEN "id" = ANY(${rows.gated}::text[]) THEN ${now} ELSE "gatedAt" END
      WHERE "id" IN (SELECT "id" FROM claimed) AND NOT ("id" = ANY(${rows.forgetting}::text[]))
    )
    SELECT coalesce((SELECT array_agg("id") FROM claimed), '{}') AS "claimed",
           coalesce((SELECT array_agg("id") FROM "inserted"), '{}') AS "snippetIds"`;
  return written;
}

/** Marks turns judged (work/turn-work.ts): the gate ran and what it asked to forget is gone. */
export async function markGated(db: TenantDb, turnIds: string[]) {
  if (turnIds.length === 0) return;
  await db.$executeRaw`
    UPDATE "Turn" SET "gatedAt" = ${appNow()}
    WHERE "tenantId" = ${db.$tenantId()} AND "id" = ANY(${turnIds}::text[]) AND "gatedAt" IS NULL`;
}
