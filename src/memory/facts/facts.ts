import { z } from "zod";
import type { CandidateFact } from "../../chains/extractor.ts";
import type { FactJudgment } from "../../chains/fact-judge.ts";
import { quoteText } from "../../chains/transcript.ts";
import type { TenantDb } from "../../db.ts";
import type { Deps } from "../../deps.ts";
import { EngramError, notFound, parseInput } from "../../errors.ts";
import { Prisma, type Fact } from "../../generated/prisma/client.ts";
import { factTextSchema } from "../../limits.ts";
import type { FactChangeKind, FactChangePayload, PubSub } from "../../pubsub.ts";
import type { ExtraBlocks } from "../context.ts";
import { externalIdSchema, requireEndUser, upsertEndUser } from "../conversations/agents.ts";
import { liveMessages } from "../conversations/live-messages.ts";
import { deleteFactRows, forgetSnippets } from "../forget.ts";
import { countTokens } from "../tokens.ts";

/** At most this many facts per user; the least recently confirmed non-core ones go first, core ones never. */
export const FACT_CAP = 50;

/** A new fact would take its user past the cap, and only core facts could make room. */
export class FactCapReached extends EngramError {
  constructor(endUserId: string) {
    super(
      "CONFLICT",
      `End user ${endUserId} is at the cap of ${FACT_CAP} facts, and core facts are never dropped to make room: ` +
        "delete a fact, or correct one to core: false, before adding another.",
    );
    this.name = "FactCapReached";
  }
}


export type FactAuthor =
  | { origin: "PERSON" | "API"; apiKeyId: string; sourceMessageId?: null; readMessageIds?: undefined }
  | { origin: "EXTRACTOR"; apiKeyId?: null; sourceMessageId: string | null; readMessageIds?: string[] };

export type FactDeps = { pubsub: PubSub; vectors: Deps["vectors"]; log: Deps["log"]; queue: Deps["queue"] };

function announce(
  db: TenantDb,
  deps: FactDeps,
  change: FactChangeKind,
  fields: Omit<FactChangePayload, "change" | "conversationId"> & { conversationId?: string | null },
) {
  deps.pubsub.publish("factChanged", db.$tenantId(), { conversationId: null, ...fields, change });
}

/** A user's facts: core first, then the most recently confirmed. */
export function listFacts(db: TenantDb, endUserId: string, query: object = {}) {
  return db.fact.findMany({
    ...query,
    where: { endUserId },
    orderBy: [{ core: "desc" }, { confirmedAt: "desc" }, { id: "asc" }],
  });
}

async function writeVersion(tx: TenantDb, fact: Fact, change: FactChangeKind, reason: string | null) {
  await tx.factVersion.create({
    data: { tenantId: tx.$tenantId(), factId: fact.id, text: fact.text, core: fact.core, change, reason, sourceMessageId: fact.sourceMessageId },
  });
}

/**
 * Inside the transaction that writes a new fact, before it is written: the facts that must go to
 * leave it room under the cap, the least recently confirmed non-core ones. Throws FactCapReached
 * when only core facts could make room. The user's row stays locked until the transaction ends,
 * so two facts written at once cannot both take the last place.
 */
async function roomForAnother(tx: TenantDb, endUserId: string): Promise<Fact[]> {
  await tx.$queryRaw`SELECT "id" FROM "EndUser" WHERE "tenantId" = ${tx.$tenantId()} AND "id" = ${endUserId} FOR NO KEY UPDATE`;
  const over = (await tx.fact.count({ where: { endUserId } })) + 1 - FACT_CAP;
  if (over <= 0) return [];
  const dropped = await tx.fact.findMany({
    where: { endUserId, core: false },
    orderBy: [{ confirmedAt: "asc" }, { id: "asc" }],
    take: over,
  });
  if (dropped.length < over) throw new FactCapReached(endUserId);
  return dropped;
}

/**
 * The facts roomForAnother picked go in the same transaction as the new fact is written (so that
 * a fact written right after counts without them); their keys' vectors and quotes after it.
 */
async function dropForRoom(db: TenantDb, deps: FactDeps, endUserId: string, dropped: Fact[], afterCommit: (db: TenantDb, deps: FactDeps) => Promise<void>) {
  if (dropped.length === 0) return;
  await afterCommit(db, deps);
  for (const fact of dropped) {
    announce(db, deps, "DELETED", { endUserId, factId: fact.id, text: fact.text, reason: `over the cap of ${FACT_CAP} facts` });
  }
}

/** The message a fact was extracted from was forgotten, or a fact from it deleted, while the extraction ran. */
class SourceForgotten extends Error {}

/**
 * Inside the transaction that writes a fact: its source message, and every other message the
 * extraction read with it (a model may draw a fact from one message and cite its neighbour), must
 * still be there, neither forgotten nor with a fact deleted from it, and they stay
 * locked (FOR SHARE, in id order as the forgets lock them) until the transaction ends. A forget
 * that marks or deletes them either commits first, and the fact is not written, or waits, and
 * then finds the fact when it sweeps again (src/memory/forget.ts): an extraction that read the
 * messages before the forget cannot bring what they said back after.
 */
async function requireSourceStillSaid(tx: TenantDb, sourceMessageId: string | null | undefined, readMessageIds: string[] = []) {
  const ids = [...new Set([...(sourceMessageId ? [sourceMessageId] : []), ...readMessageIds])];
  if (ids.length === 0) return;
  const live = await tx.$queryRaw<{ id: string; factsForgotten: boolean }[]>`
    WITH ${liveMessages("live", tx.$tenantId(), ids)} SELECT "id", "factsForgotten" FROM "live"`;
  if (live.length !== ids.length || live.some((m) => m.factsForgotten)) throw new SourceForgotten();
}

async function createFact(
  db: TenantDb,
  deps: FactDeps,
  input: {
    /** Engram's id of the end user; or, by the caller's own id, the end user created with the fact on first use. */
    endUserId: string | { externalId: string };
    text: string;
    core: boolean;
    subject?: string | null;
    sensitivity?: string | null;
    contradictsId?: string | null;
  },
  author: FactAuthor,
  change: FactChangeKind,
  reason: string,
  conversationId: string | null = null,
) {
  const { fact, dropped, afterCommit } = await db.$transaction(async (tx) => {
    // Created in the transaction that writes the fact: a write that fails leaves no empty user.
    const endUserId = typeof input.endUserId === "string" ? input.endUserId : (await upsertEndUser(tx as TenantDb, input.endUserId)).id;
    const dropped = await roomForAnother(tx as TenantDb, endUserId);
    await requireSourceStillSaid(tx as TenantDb, author.sourceMessageId, author.readMessageIds);
    const created = await tx.fact.create({
      data: {
        tenantId: db.$tenantId(),
        endUserId,
        text: input.text,
        core: input.core,
        subject: input.subject ?? null,
        sensitivity: input.sensitivity ?? null,
        contradictsId: input.contradictsId ?? null,
        origin: author.origin,
        apiKeyId: author.apiKeyId ?? null,
        sourceMessageId: author.sourceMessageId ?? null,
      },
    });
    await writeVersion(tx as TenantDb, created, change, reason);
    const { afterCommit } = await deleteFactRows(tx as TenantDb, dropped.map((f) => f.id));
    return { fact: created, dropped, afterCommit };
  });
  announce(db, deps, change, { endUserId: fact.endUserId, factId: fact.id, text: fact.text, reason, conversationId });
  await dropForRoom(db, deps, fact.endUserId, dropped, afterCommit);
  return fact;
}

const factSubject = z.string().trim().max(120).nullish().transform((v) => v || null);

/** The end user by Engram's id, or by the caller's own id (as recordTurn takes it): exactly one of the two. */
export const addFactInput = z
  .object({
    endUserId: z.string().min(1).nullish(),
    endUserExternalId: externalIdSchema.nullish(),
    text: factTextSchema,
    core: z.boolean().nullish().transform((v) => v ?? false),
    subject: factSubject,
  })
  .superRefine((input, ctx) => {
    if ((input.endUserId == null) === (input.endUserExternalId == null)) {
      ctx.addIssue({ code: "custom", message: "Give either endUserId or endUserExternalId." });
    }
  });

/**
 * A fact written by a person or through the API; refused (FactCapReached) when it cannot fit under
 * the cap. By endUserExternalId, an end user not known yet is created with the fact, in its
 * transaction: a refused or failed write creates no user.
 */
export async function addFact(db: TenantDb, deps: FactDeps, input: z.input<typeof addFactInput>, author: FactAuthor) {
  const { endUserId, endUserExternalId, ...fact } = parseInput(addFactInput, input);
  if (endUserId != null) await requireEndUser(db, endUserId);
  return createFact(db, deps, { ...fact, endUserId: endUserId ?? { externalId: endUserExternalId! } }, author, "ADDED", "added by a person");
}

/**
 * Inside the transaction that changes what a fact says (a person's correction, the extractor's
 * update): locks the fact first, as deleteFactRows does, then deletes its recall keys' rows and
 * returns their ids, whose vectors the caller takes out once it has committed (forgetSnippets). A
 * key is the fact's sentence as it was: left until syncFactKeys next ran (after an extraction, and
 * never for a fact a person corrected, which is read from no message), or until its new text was
 * embedded (a spent budget waits for the month), recall found the turn through the replaced wording.
 * With the lock, a key syncFactKeys writes meanwhile (its statement holds the fact FOR KEY SHARE)
 * either committed before and goes here, or waits and then writes from the fact as changed.
 */
async function dropKeyRows(tx: TenantDb, factId: string): Promise<string[]> {
  await tx.$queryRaw`SELECT "id" FROM "Fact" WHERE "tenantId" = ${tx.$tenantId()} AND "id" = ${factId} FOR UPDATE`;
  const keys = await tx.recallSnippet.findMany({ where: { factId }, select: { id: true } });
  if (keys.length) await tx.recallSnippet.deleteMany({ where: { id: { in: keys.map((k) => k.id) } } });
  return keys.map((k) => k.id);
}

export const correctFactInput = z.object({
  text: factTextSchema.nullish(),
  core: z.boolean().nullish(),
  /** Absent: unchanged; null or empty: the end user; else the person it is about. */
  subject: z.string().trim().max(120).nullish(),
});

/**
 * A person's correction: the fact changes, its earlier text stays in its history, and the key
 * that corrected it is its author now. Saving it unchanged changes nothing. It is no longer what
 * a message said, so its recall key goes (dropKeyRows) and none is made again (syncFactKeys keys
 * only facts read from a message).
 */
export async function correctFact(
  db: TenantDb,
  deps: FactDeps,
  id: string,
  input: z.input<typeof correctFactInput>,
  author: { apiKeyId: string },
) {
  const parsed = parseInput(correctFactInput, input);
  const result = await db.$transaction(async (tx) => {
    const existing = await tx.fact.findUnique({ where: { id } });
    if (!existing) throw notFound("Fact", id);
    const text = parsed.text ?? existing.text;
    const core = parsed.core ?? existing.core;
    const subject = parsed.subject === undefined ? existing.subject : parsed.subject || null;
    if (text === existing.text && core === existing.core && subject === existing.subject) return { fact: existing, changed: false, keyIds: [] };
    const keyIds = await dropKeyRows(tx as TenantDb, id);
    const updated = await tx.fact.update({
      where: { id },
      data: {
        text,
        core,
        subject,
        confirmedAt: new Date(),
        origin: "PERSON",
        apiKeyId: author.apiKeyId,
        sourceMessageId: null,
      },
    });
    await writeVersion(tx as TenantDb, updated, "CORRECTED", "corrected by a person");
    return { fact: updated, changed: true, keyIds };
  });
  await forgetSnippets(db, deps, result.keyIds);
  if (result.changed) {
    announce(db, deps, "CORRECTED", { endUserId: result.fact.endUserId, factId: id, text: result.fact.text, reason: "corrected by a person" });
  }
  return result.fact;
}

export type CandidateOutcome = { change: FactChangeKind | "DROPPED"; reason: string; factId: string | null };

/**
 * Applies the fact judge's rules exactly: situational and noise are dropped; sensitive facts
 * are dropped unless the agent allows them; "same" refreshes the stored fact's confirmation;
 * "update" replaces it (its earlier text stays in its history); "contradiction" keeps both,
 * the newer first. A new fact that cannot fit under the cap (only core facts could make room) is dropped.
 */
export async function applyCandidate(db: TenantDb, deps: FactDeps, input: CandidateInput): Promise<CandidateOutcome> {
  try {
    return await applyJudgedCandidate(db, deps, input);
  } catch (error) {
    if (error instanceof FactCapReached) {
      return { change: "DROPPED", reason: `no room: the user is at the cap of ${FACT_CAP} facts, and core facts are never dropped to make room`, factId: null };
    }
    if (!(error instanceof SourceForgotten)) throw error;
    return { change: "DROPPED", reason: "its message was forgotten, or a fact from it deleted, while it was read", factId: null };
  }
}

type CandidateInput = {
  endUserId: string;
  candidate: CandidateFact;
  judgment: FactJudgment;
  allowSensitive: boolean;
  sourceMessageId: string | null;
  /** Every message the extraction read with the source: a forget of any of them drops the candidate. */
  readMessageIds?: string[];
  conversationId: string;
};

async function applyJudgedCandidate(db: TenantDb, deps: FactDeps, input: CandidateInput): Promise<CandidateOutcome> {
  const { endUserId, candidate, judgment, conversationId } = input;
  if (judgment.durability !== "durable") {
    return { change: "DROPPED", reason: `${judgment.durability}, not durable`, factId: null };
  }
  if (judgment.sensitivity && !input.allowSensitive) {
    return { change: "DROPPED", reason: `sensitive (${judgment.sensitivity}) and the agent does not allow sensitive facts`, factId: null };
  }
  const related = judgment.relatedFactId
    ? await db.fact.findFirst({ where: { id: judgment.relatedFactId, endUserId } })
    : null;
  const author: FactAuthor = { origin: "EXTRACTOR", sourceMessageId: input.sourceMessageId, readMessageIds: input.readMessageIds };
  const base = { endUserId, text: candidate.text, core: candidate.core, subject: candidate.subject ?? null, sensitivity: judgment.sensitivity };

  if (judgment.relation === "same" && related) {
    await db.fact.update({ where: { id: related.id }, data: { confirmedAt: new Date() } });
    announce(db, deps, "REFRESHED", { endUserId, factId: related.id, text: related.text, reason: "the user said it again", conversationId });
    return { change: "REFRESHED", reason: "the user said it again", factId: related.id };
  }
  if (judgment.relation === "update" && related) {
    const reason = `replaces: ${related.text}`;
    const { updated, keyIds } = await db.$transaction(async (tx) => {
      await requireSourceStillSaid(tx as TenantDb, input.sourceMessageId, input.readMessageIds);
      // syncFactKeys (indexFactKeys, after the extraction) makes the key of its new sentence.
      const keyIds = await dropKeyRows(tx as TenantDb, related.id);
      const fact = await tx.fact.update({
        where: { id: related.id },
        data: {
          text: candidate.text,
          core: candidate.core || related.core,
          subject: candidate.subject ?? null,
          sensitivity: judgment.sensitivity,
          confirmedAt: new Date(),
          origin: "EXTRACTOR",
          apiKeyId: null,
          sourceMessageId: input.sourceMessageId,
        },
      });
      await writeVersion(tx as TenantDb, fact, "UPDATED", reason);
      return { updated: fact, keyIds };
    });
    await forgetSnippets(db, deps, keyIds);
    announce(db, deps, "UPDATED", { endUserId, factId: updated.id, text: updated.text, reason, conversationId });
    return { change: "UPDATED", reason, factId: updated.id };
  }
  if (judgment.relation === "same") {
    // It repeats a stored fact the judge did not name rightly: adding it would store it twice.
    return { change: "DROPPED", reason: "the judge found it stored already, under an id the user has no fact for", factId: null };
  }
  if (judgment.relation === "contradiction" && related) {
    const reason = `contradicts: ${related.text}`;
    const fact = await createFact(db, deps, { ...base, contradictsId: related.id }, author, "CONTRADICTED", reason, conversationId);
    return { change: "CONTRADICTED", reason, factId: fact.id };
  }
  const fact = await createFact(db, deps, base, author, "ADDED", "the user said it", conversationId);
  return { change: "ADDED", reason: "the user said it", factId: fact.id };
}

/**
 * The FACTS block of the context: what the user has said about themselves, core first, then
 * what they said about each person they named, under that person's name.
 */
export function factsBlocks(db: TenantDb): ExtraBlocks {
  return async ({ endUserId }) => {
    const facts = await listFacts(db, endUserId);
    if (!facts.length) return { blocks: [], degraded: [] };
    const subjects = [...new Set(facts.map((f) => f.subject))].sort((a, b) => (a === null ? -1 : b === null ? 1 : a.localeCompare(b)));
    const items = subjects.flatMap((subject) =>
      facts
        .filter((f) => f.subject === subject)
        .map((f) => {
          const text = `- ${quoteText(f.text)}`;
          return { id: f.id, text, tokens: countTokens(text), score: f.core ? 1 : 0, subject };
        }),
    );
    const text = subjects
      .map((subject) => {
        const lines = items.filter((i) => i.subject === subject).map((i) => i.text).join("\n");
        return subject === null ? lines : `About ${quoteText(subject)}:\n${lines}`;
      })
      .join("\n\n");
    return {
      blocks: [
        {
          kind: "FACTS",
          title: "What the user has told us",
          text,
          tokens: countTokens(text),
          items: items.map(({ subject: _, ...item }) => item),
        },
      ],
      degraded: [],
    };
  };
}
