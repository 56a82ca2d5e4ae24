import { z } from "zod";
import { appNow, type TenantDb } from "../../db.ts";
import { badInput, notFound, parseInput } from "../../errors.ts";
import type { Agent } from "../../generated/prisma/client.ts";

/** An id the caller gives for its own agent, end user or conversation. */
export const externalIdSchema = z.string().trim().min(1).max(200);

const settingFields = z.object({
  summaryOn: z.boolean(),
  tailSize: z.number().int().min(1).max(100),
  historySize: z.number().int().min(1).max(500),
  summaryWordLimit: z.number().int().min(20).max(1_000),
  recallOn: z.boolean(),
  extractionOn: z.boolean(),
  allowSensitiveFacts: z.boolean(),
  extractionBatchSize: z.number().int().min(1).max(100),
  /** Seed 003's timer: a quiet conversation's pending messages are read even below a batch. */
  quietExtractionSeconds: z.number().int().min(0).max(604_800),
});

export type AgentSettings = z.infer<typeof settingFields>;

/** The product's defaults (SPEC §4–§6). */
export const DEFAULT_AGENT_SETTINGS: AgentSettings = {
  summaryOn: true,
  tailSize: 6,
  historySize: 20,
  summaryWordLimit: 150,
  recallOn: true,
  extractionOn: true,
  allowSensitiveFacts: false,
  extractionBatchSize: 8,
  quietExtractionSeconds: 600,
};

const withoutNulls = (value: unknown) =>
  value && typeof value === "object"
    ? Object.fromEntries(Object.entries(value).filter(([, v]) => v != null))
    : value;

/** A partial change of settings; nulls mean "leave as is". */
export const agentSettingsPatch = z.preprocess(withoutNulls, settingFields.partial().strict());

// Built once: a zod schema built per call cost more than the parse (every recorded turn reads its agent's settings).
const storedSettings = settingFields.partial();

/** Stored settings with defaults filled in (stored JSON only holds what was set). */
export function agentSettings(agent: Pick<Agent, "settings">): AgentSettings {
  const stored = storedSettings.safeParse(agent.settings ?? {});
  return { ...DEFAULT_AGENT_SETTINGS, ...(stored.success ? stored.data : {}) };
}

export const upsertAgentInput = z.object({
  externalId: externalIdSchema,
  name: z.string().trim().min(1).max(200).nullish(),
  settings: agentSettingsPatch.nullish(),
});

/**
 * Creates or updates an agent by the caller's own id; settings given are merged over stored ones.
 * One upsert statement: callers at once for one agent (a first use among them) each merge into
 * the row as it stands, so no caller's settings are lost and none fails on the other's insert.
 */
export async function upsertAgent(db: TenantDb, input: z.input<typeof upsertAgentInput>, actor: { apiKeyId?: string | null } = {}) {
  const parsed = parseInput(upsertAgentInput, input);
  // The change and its audit row commit together: no setting changes unrecorded.
  const id = await db.$transaction(async (tx) => {
    const [{ id }] = await tx.$queryRaw<{ id: string }[]>`
      INSERT INTO "Agent" ("id", "tenantId", "externalId", "name", "settings", "createdAt", "updatedAt")
      VALUES (gen_random_uuid()::text, ${db.$tenantId()}, ${parsed.externalId}, ${parsed.name ?? parsed.externalId},
        ${JSON.stringify(parsed.settings ?? {})}::jsonb, ${appNow()}, ${appNow()})
      ON CONFLICT ("tenantId", "externalId") DO UPDATE SET
        "settings" = "Agent"."settings" || EXCLUDED."settings",
        "name" = COALESCE(${parsed.name ?? null}::text, "Agent"."name"),
        "updatedAt" = ${appNow()}
      RETURNING "id"`;
    // What was asked, not the merged result: the settings given and the name (no conversation content).
    await tx.auditLog.create({
      data: {
        tenantId: db.$tenantId(),
        apiKeyId: actor.apiKeyId ?? null,
        action: "agent.upsert",
        changes: { agentId: id, externalId: parsed.externalId, name: parsed.name ?? null, settings: parsed.settings ?? {} },
      },
    });
    return id;
  });
  return db.agent.findUniqueOrThrow({ where: { id } });
}

export const upsertEndUserInput = z.object({
  externalId: externalIdSchema,
  displayName: z.string().trim().min(1).max(200).nullish(),
});

/**
 * Creates or renames an end user by the caller's own id. One insert that waits for a concurrent
 * first use of the same id and then finds its row: Prisma's upsert reads, then inserts, and of
 * callers at once for a new id (an agent's parallel `remember`s, addFact in its transaction) all
 * but one failed on the unique key.
 */
export async function upsertEndUser(db: TenantDb, input: z.input<typeof upsertEndUserInput>) {
  const { externalId: id, displayName } = parseInput(upsertEndUserInput, input);
  const tenantId = db.$tenantId();
  await db.$executeRaw`
    INSERT INTO "EndUser" ("id", "tenantId", "externalId", "displayName", "createdAt", "updatedAt")
    VALUES (gen_random_uuid()::text, ${tenantId}, ${id}, ${displayName ?? null}, ${appNow()}, ${appNow()})
    ON CONFLICT ("tenantId", "externalId") DO UPDATE SET "displayName" = EXCLUDED."displayName", "updatedAt" = EXCLUDED."updatedAt"
      WHERE EXCLUDED."displayName" IS NOT NULL`;
  return db.endUser.findUniqueOrThrow({ where: { tenantId_externalId: { tenantId, externalId: id } } });
}

/** NOT_FOUND unless the tenant has this end user. */
export async function requireEndUser(db: TenantDb, endUserId: string) {
  if (!(await db.endUser.count({ where: { id: endUserId } }))) throw notFound("End user", endUserId);
}

/** An end user named by Engram's id or by the caller's own (as recordTurn takes it). */
export type EndUserRef = { endUserId?: string | number | null; endUserExternalId?: string | null };

/**
 * The id of the end user a request names by exactly one of Engram's id and the caller's own:
 * BAD_USER_INPUT for both or neither, NOT_FOUND for a user the tenant does not have. The
 * caller's id is trimmed and bounded as recordTurn takes it, so " bob" is the bob it recorded.
 * `checkId: false` leaves Engram's id unchecked, for a caller whose own answer shows it exists.
 */
export async function endUserIdOf(db: TenantDb, ref: EndUserRef, { checkId = true } = {}): Promise<string> {
  if ((ref.endUserId == null) === (ref.endUserExternalId == null)) {
    throw badInput("Give the end user by endUserId or by endUserExternalId: exactly one of the two.");
  }
  if (ref.endUserId != null) {
    const endUserId = String(ref.endUserId);
    if (checkId) await requireEndUser(db, endUserId);
    return endUserId;
  }
  const externalId = parseInput(externalIdSchema, ref.endUserExternalId);
  const user = await db.endUser.findUnique({ where: { tenantId_externalId: { tenantId: db.$tenantId(), externalId } }, select: { id: true } });
  if (!user) throw notFound("End user", externalId);
  return user.id;
}
