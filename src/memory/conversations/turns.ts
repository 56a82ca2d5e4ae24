import { z } from "zod";
import { appNow, isUniqueViolation, rowFromJson, type TenantDb } from "../../db.ts";
import { EngramError, notFound, parseInput } from "../../errors.ts";
import { Prisma, type Agent, type Conversation, type EndUser, type MessageRole, type Turn } from "../../generated/prisma/client.ts";
import { callerVerdictSchema, storeCallerVerdict } from "../gate/gate.ts";
import { externalIdSchema } from "./agents.ts";
import { MESSAGE_LIMITS, pastMomentSchema } from "../../limits.ts";

const content = z.string().min(1).max(MESSAGE_LIMITS.messageMaxChars);

const occurredAt = pastMomentSchema.nullish();

const participants = {
  agentExternalId: externalIdSchema,
  endUserExternalId: externalIdSchema,
  conversationExternalId: externalIdSchema,
};

export const recordTurnInput = z.object({
  ...participants,
  clientTurnId: z.string().trim().min(1).max(200),
  userMessage: content,
  assistantMessage: content.nullish(),
  /** The agent's private steps (tool calls, scratchpad): kept, never shared memory. */
  privateSteps: z.array(content).max(MESSAGE_LIMITS.privateStepsMax).nullish(),
  occurredAt,
  /** The verdict of the caller's own model on the user's message (gateInstructions): no gate call then. */
  gate: callerVerdictSchema.nullish(),
});

export const importConversationInput = z.object({
  ...participants,
  messages: z
    .array(
      z.object({
        role: z.enum(["USER", "ASSISTANT", "SYSTEM", "TOOL"]),
        content,
        occurredAt,
        private: z.boolean().nullish(),
      }),
    )
    .min(1)
    .max(MESSAGE_LIMITS.importMessagesMax),
});

type NewMessage = { role: MessageRole; content: string; private: boolean; occurredAt: Date };

// Many turns of one conversation may arrive at once; each waits its turn for the row lock.
const TX = { maxWait: 30_000, timeout: 30_000 } as const;

/** Finds or creates the agent, the end user and the conversation a message belongs to. */
async function conversationFor(tx: TenantDb, tenantId: string, ids: z.infer<z.ZodObject<typeof participants>>) {
  const agent = await tx.agent.upsert({
    where: { tenantId_externalId: { tenantId, externalId: ids.agentExternalId } },
    create: { tenantId, externalId: ids.agentExternalId, name: ids.agentExternalId },
    update: {},
  });
  const endUser = await tx.endUser.upsert({
    where: { tenantId_externalId: { tenantId, externalId: ids.endUserExternalId } },
    create: { tenantId, externalId: ids.endUserExternalId },
    update: {},
  });
  const conversation = await tx.conversation.upsert({
    where: { tenantId_externalId: { tenantId, externalId: ids.conversationExternalId } },
    create: { tenantId, externalId: ids.conversationExternalId, agentId: agent.id, endUserId: endUser.id },
    update: {},
  });
  if (conversation.agentId !== agent.id || conversation.endUserId !== endUser.id) {
    throw new EngramError(
      "CONFLICT",
      `Conversation ${ids.conversationExternalId} belongs to another agent or end user.`,
    );
  }
  return conversation;
}

/**
 * Appends messages with the next sequence numbers. Incrementing lastSeq takes the conversation's
 * row lock, so concurrent writers get consecutive, gapless ranges.
 */
async function appendMessages(tx: TenantDb, tenantId: string, conversationId: string, messages: NewMessage[]) {
  const { lastSeq } = await tx.conversation.update({
    where: { id: conversationId },
    data: { lastSeq: { increment: messages.length } },
    select: { lastSeq: true },
  });
  const firstSeq = lastSeq - messages.length + 1;
  await tx.message.createMany({
    data: messages.map((message, i) => ({ ...message, tenantId, conversationId, seq: firstSeq + i })),
  });
  return { firstSeq, lastSeq };
}

/**
 * Whether a retry carries the messages its turn was first recorded with (role, text, private, in
 * order). A turn whose messages were forgotten or aged out since cannot be compared, and counts
 * as the same: refusing a real retry is worse than returning its turn. That includes messages
 * forgotten but kept as a record (forgetDeletesMessages off): compared, a caller could guess their
 * text by retrying until the answer is not CONFLICT.
 */
async function sameMessages(tx: TenantDb, turn: Pick<Turn, "conversationId" | "firstSeq" | "lastSeq">, messages: NewMessage[]) {
  const stored = await tx.message.findMany({
    where: { conversationId: turn.conversationId, seq: { gte: turn.firstSeq, lte: turn.lastSeq } },
    select: { role: true, content: true, private: true, forgottenAt: true },
    orderBy: { seq: "asc" },
  });
  if (stored.length !== turn.lastSeq - turn.firstSeq + 1 || stored.some((m) => m.forgottenAt)) return true;
  return (
    stored.length === messages.length &&
    stored.every((m, i) => m.role === messages[i].role && m.content === messages[i].content && m.private === messages[i].private)
  );
}

type Nullable<T> = { [K in keyof T]: T[K] | null };

type KnownConversation = {
  id: string;
  agentId: string;
  endUserId: string;
  agentExternalId: string;
  endUserExternalId: string;
  agentRow?: Record<string, unknown>;
  endUserRow?: Record<string, unknown>;
};

/**
 * The hot path, for a conversation that exists: one statement (atomic on its own, so no
 * transaction) reads the conversation and any earlier turn with this clientTurnId and, when the
 * conversation is the caller's and the turn id is free, bumps lastSeq under the conversation's
 * row lock and inserts the messages and the turn. "new" when there is no such conversation yet;
 * null when it belongs to someone else or the turn id was used: the caller's transactional path
 * then decides.
 */
async function appendToKnownConversation(
  db: TenantDb,
  parsed: z.infer<typeof recordTurnInput>,
  messages: NewMessage[],
  occurredAt: Date,
  withRows: boolean,
): Promise<RecordedTurn | "new" | null> {
  const tenantId = db.$tenantId();
  const n = messages.length;
  const at = occurredAt.toISOString();
  const now = appNow();
  // Always one row: the conversation's columns are null when it does not exist, the turn's when
  // nothing was written.
  const [row] = await db.$queryRaw<(Nullable<KnownConversation> & { turnTaken: boolean } & { [K in keyof Turn as `turn_${K}`]: Turn[K] | null } & { conversationRow: Record<string, unknown> | null })[]>`
    WITH known AS (
      SELECT c."id", c."agentId", c."endUserId", a."externalId" AS "agentExternalId", u."externalId" AS "endUserExternalId",
             ${withRows ? Prisma.sql`to_jsonb(a) AS "agentRow", to_jsonb(u) AS "endUserRow",` : Prisma.empty}
             EXISTS (SELECT 1 FROM "Turn" t WHERE t."tenantId" = ${tenantId} AND t."clientTurnId" = ${parsed.clientTurnId}) AS "turnTaken"
      FROM (SELECT 1) AS one
      LEFT JOIN ("Conversation" c JOIN "Agent" a ON a."id" = c."agentId" JOIN "EndUser" u ON u."id" = c."endUserId")
        ON c."tenantId" = ${tenantId} AND c."externalId" = ${parsed.conversationExternalId}
    ), conv AS (
      UPDATE "Conversation" SET "lastSeq" = "lastSeq" + ${n}, "updatedAt" = ${now}
      FROM known
      WHERE "Conversation"."tenantId" = ${tenantId} AND "Conversation"."id" = known."id" AND NOT known."turnTaken"
        AND known."agentExternalId" = ${parsed.agentExternalId} AND known."endUserExternalId" = ${parsed.endUserExternalId}
      RETURNING "Conversation"."id", "Conversation"."lastSeq"${withRows ? Prisma.sql`, to_jsonb("Conversation") AS "row"` : Prisma.empty}
    ), inserted AS (
      INSERT INTO "Message" ("id", "tenantId", "conversationId", "seq", "role", "content", "private", "occurredAt", "createdAt")
      SELECT gen_random_uuid()::text, ${tenantId}, conv."id", conv."lastSeq" - ${n} + m.ord, m.role::"MessageRole", m.content, m.private, ${at}::timestamp(3), ${now}
      FROM conv, unnest(${messages.map((m) => m.role)}::text[], ${messages.map((m) => m.content)}::text[], ${messages.map((m) => m.private)}::boolean[])
        WITH ORDINALITY AS m(role, content, private, ord)
      RETURNING 1
    ), turn AS (
      INSERT INTO "Turn" ("id", "tenantId", "conversationId", "clientTurnId", "firstSeq", "lastSeq", "occurredAt", "createdAt")
      SELECT gen_random_uuid()::text, ${tenantId}, conv."id", ${parsed.clientTurnId}, conv."lastSeq" - ${n} + 1, conv."lastSeq", ${at}::timestamp(3), ${now}
      FROM conv
      RETURNING *
    )
    SELECT known.*, turn."id" AS "turn_id", turn."tenantId" AS "turn_tenantId", turn."conversationId" AS "turn_conversationId",
           turn."clientTurnId" AS "turn_clientTurnId", turn."firstSeq" AS "turn_firstSeq", turn."lastSeq" AS "turn_lastSeq",
           turn."occurredAt" AS "turn_occurredAt", turn."createdAt" AS "turn_createdAt", turn."followUpsQueuedAt" AS "turn_followUpsQueuedAt",
           turn."gatedAt" AS "turn_gatedAt",
           ${withRows ? Prisma.sql`conv."row"` : Prisma.sql`NULL::jsonb`} AS "conversationRow"
    FROM known LEFT JOIN turn ON true LEFT JOIN conv ON true`;
  // A concurrent turn with the same id makes the turn's insert fail on the unique index; the
  // caller's retry then finds it.
  if (row.turn_id) {
    return {
      turn: {
        id: row.turn_id,
        tenantId: row.turn_tenantId!,
        conversationId: row.turn_conversationId!,
        clientTurnId: row.turn_clientTurnId!,
        firstSeq: row.turn_firstSeq!,
        lastSeq: row.turn_lastSeq!,
        occurredAt: row.turn_occurredAt!,
        createdAt: row.turn_createdAt!,
        followUpsQueuedAt: row.turn_followUpsQueuedAt,
        gatedAt: row.turn_gatedAt,
      },
      conversation: { id: row.id!, agentId: row.agentId!, endUserId: row.endUserId! },
      created: true,
      // As this write left them (the conversation as updated; its agent and end user as read), for
      // an answer that selects them.
      rows: withRows
        ? {
            conversation: rowFromJson<Conversation>("Conversation", row.conversationRow!),
            agent: rowFromJson<Agent>("Agent", row.agentRow!),
            endUser: rowFromJson<EndUser>("EndUser", row.endUserRow!),
          }
        : undefined,
    };
  }
  if (row.turnTaken) return null;
  if (!row.id) return "new";
  // Someone else's conversation (another agent or end user): the transactional path says so.
  return null;
}

/**
 * Creates what a first turn needs and does not exist yet (the agent, the end user, the
 * conversation) in one statement, each insert skipping a row that is there: no transaction is
 * held open across round trips, which on the embedded store would hold its one session while
 * every other request waits. Nothing is inserted when the conversation or the turn id exists by
 * the time the statement starts (the transactional path then says what clashed). The conversation
 * is not inserted when its agent or end user appeared after the statement began (a concurrent
 * first use): the caller then takes the transactional path. Only a clash that commits while this
 * statement runs can leave a new agent or end user without the conversation (ids, no content).
 */
async function createConversation(db: TenantDb, ids: z.infer<z.ZodObject<typeof participants>> & { clientTurnId: string }) {
  const tenantId = db.$tenantId();
  const now = appNow();
  const free = Prisma.sql`NOT EXISTS (SELECT 1 FROM "Conversation" WHERE "tenantId" = ${tenantId} AND "externalId" = ${ids.conversationExternalId})
    AND NOT EXISTS (SELECT 1 FROM "Turn" WHERE "tenantId" = ${tenantId} AND "clientTurnId" = ${ids.clientTurnId})`;
  await db.$executeRaw`
    WITH new_agent AS (
      INSERT INTO "Agent" ("id", "tenantId", "externalId", "name", "createdAt", "updatedAt")
      SELECT gen_random_uuid()::text, ${tenantId}, ${ids.agentExternalId}, ${ids.agentExternalId}, ${now}, ${now}
      WHERE ${free}
      ON CONFLICT ("tenantId", "externalId") DO NOTHING RETURNING "id"
    ), agent AS (
      SELECT "id" FROM new_agent
      UNION ALL SELECT "id" FROM "Agent" WHERE "tenantId" = ${tenantId} AND "externalId" = ${ids.agentExternalId}
    ), new_user AS (
      INSERT INTO "EndUser" ("id", "tenantId", "externalId", "createdAt", "updatedAt")
      SELECT gen_random_uuid()::text, ${tenantId}, ${ids.endUserExternalId}, ${now}, ${now}
      WHERE ${free}
      ON CONFLICT ("tenantId", "externalId") DO NOTHING RETURNING "id"
    ), end_user AS (
      SELECT "id" FROM new_user
      UNION ALL SELECT "id" FROM "EndUser" WHERE "tenantId" = ${tenantId} AND "externalId" = ${ids.endUserExternalId}
    )
    INSERT INTO "Conversation" ("id", "tenantId", "externalId", "agentId", "endUserId", "createdAt", "updatedAt")
    SELECT gen_random_uuid()::text, ${tenantId}, ${ids.conversationExternalId}, agent."id", end_user."id", ${now}, ${now}
    FROM agent, end_user WHERE ${free} LIMIT 1
    ON CONFLICT ("tenantId", "externalId") DO NOTHING`;
}

export type RecordedTurn = {
  turn: Turn;
  conversation: Pick<Conversation, "id" | "agentId" | "endUserId">;
  created: boolean;
  /** The conversation, its agent and end user as the write left them, when one statement did it all. */
  rows?: { conversation: Conversation; agent: Agent; endUser: EndUser };
};

/**
 * Records one turn (the user's message, the agent's private steps, its reply). Creates the
 * conversation on first use; idempotent on clientTurnId: a retry returns the first turn, and the
 * same id with other messages is refused (CONFLICT) rather than dropping them.
 */
export async function recordTurn(
  db: TenantDb,
  // `gate` comes as the caller's JSON and is checked here, with the rest.
  input: Omit<z.input<typeof recordTurnInput>, "gate"> & { gate?: unknown },
  /** Also return the conversation, its agent and end user as the write left them (`rows`), when one statement did it all. */
  options: { rows?: boolean } = {},
): Promise<RecordedTurn> {
  const parsed = parseInput(recordTurnInput, input);
  const tenantId = db.$tenantId();
  const occurredAt = parsed.occurredAt ?? new Date();
  const messages: NewMessage[] = [
    { role: "USER", content: parsed.userMessage, private: false, occurredAt },
    ...(parsed.privateSteps ?? []).map((step) => ({
      role: "ASSISTANT" as const,
      content: step,
      private: true,
      occurredAt,
    })),
    ...(parsed.assistantMessage
      ? [{ role: "ASSISTANT" as const, content: parsed.assistantMessage, private: false, occurredAt }]
      : []),
  ];
  const attempt = async () => {
    let fast = await appendToKnownConversation(db, parsed, messages, occurredAt, options.rows ?? false);
    if (fast === "new") {
      await createConversation(db, parsed);
      fast = await appendToKnownConversation(db, parsed, messages, occurredAt, options.rows ?? false);
    }
    const recorded = fast && fast !== "new" ? fast : await firstUse();
    // The caller's verdict, stored before the turn's follow-ups are queued (afterTurnRecorded),
    // so the background gate finds it. Were this write lost, that gate would decide instead.
    if (parsed.gate && recorded.created) {
      await storeCallerVerdict(db, { conversationId: recorded.conversation.id, message: parsed.userMessage, verdict: parsed.gate });
    }
    return recorded;
  };
  // A retried turn, a clash, or a first use that raced another takes the careful path: one
  // transaction that finds the earlier turn, creates what is missing and says what clashed.
  const firstUse = () =>
    db.$transaction(async (tx) => {
      const existing = await tx.turn.findFirst({
        where: { clientTurnId: parsed.clientTurnId },
        include: {
          conversation: {
            select: { id: true, externalId: true, agentId: true, endUserId: true, agent: { select: { externalId: true } }, endUser: { select: { externalId: true } } },
          },
        },
      });
      if (existing) {
        // A retry is the same turn of the same conversation, agent and end user; the same id
        // elsewhere is a clash, not a retry, and must not swallow the new messages.
        const { agent, endUser, ...conversation } = existing.conversation;
        if (agent.externalId !== parsed.agentExternalId || endUser.externalId !== parsed.endUserExternalId) {
          throw new EngramError(
            "CONFLICT",
            `clientTurnId ${parsed.clientTurnId} was already used by another agent or end user; turn ids are unique per tenant.`,
          );
        }
        if (conversation.externalId !== parsed.conversationExternalId) {
          throw new EngramError(
            "CONFLICT",
            `clientTurnId ${parsed.clientTurnId} was already used in another conversation; turn ids are unique per tenant.`,
          );
        }
        if (!(await sameMessages(tx as TenantDb, existing, messages))) {
          throw new EngramError(
            "CONFLICT",
            `clientTurnId ${parsed.clientTurnId} was already used for a turn with other messages; a retry sends the same messages, a new turn a new id.`,
          );
        }
        const { conversation: _, ...turn } = existing;
        return { turn, conversation, created: false };
      }
      const conversation = await conversationFor(tx as TenantDb, tenantId, parsed);
      const range = await appendMessages(tx as TenantDb, tenantId, conversation.id, messages);
      const turn = await tx.turn.create({
        data: { tenantId, conversationId: conversation.id, clientTurnId: parsed.clientTurnId, occurredAt, ...range },
      });
      return { turn, conversation, created: true };
    }, TX);
  for (let tries = 1; ; tries++) {
    try {
      return await attempt();
    } catch (error) {
      // A concurrent first use of the same conversation or turn id: the other one won; go again.
      if (!isUniqueViolation(error) || tries >= 5) throw error;
    }
  }
}

/**
 * Backfills a whole past conversation in one call (for users moving from another memory
 * system). The conversation must be new or empty, so an import cannot be doubled; the same
 * import again (a retry whose answer was lost, a file imported again after a crash) returns the
 * first one's turn, `created: false`, as recordTurn answers a retried turn.
 */
export async function importConversation(db: TenantDb, input: z.input<typeof importConversationInput>) {
  const parsed = parseInput(importConversationInput, input);
  const tenantId = db.$tenantId();
  const now = new Date();
  return db.$transaction(async (tx) => {
    const conversation = await conversationFor(tx as TenantDb, tenantId, parsed);
    const messages = parsed.messages.map((m) => ({
      role: m.role,
      content: m.content,
      private: m.private ?? false,
      occurredAt: m.occurredAt ?? now,
    }));
    if (conversation.lastSeq > 0) {
      const earlier = await tx.turn.findFirst({ where: { conversationId: conversation.id, clientTurnId: `import:${conversation.id}` } });
      if (earlier && (await sameMessages(tx as TenantDb, earlier, messages))) return { turn: earlier, conversation, created: false };
      throw new EngramError(
        "CONFLICT",
        `Conversation ${parsed.conversationExternalId} already has messages${earlier ? " other than these" : ""}; import only into a new one.`,
      );
    }
    const range = await appendMessages(tx as TenantDb, tenantId, conversation.id, messages);
    // The whole import is one turn: its follow-ups (snippets, summary, extraction) go through the
    // same outbox as a recorded turn's.
    const turn = await tx.turn.create({
      data: {
        tenantId,
        conversationId: conversation.id,
        clientTurnId: `import:${conversation.id}`,
        occurredAt: messages[0].occurredAt,
        ...range,
      },
    });
    return { turn, conversation, created: true };
  }, { ...TX, timeout: 120_000 });
}
