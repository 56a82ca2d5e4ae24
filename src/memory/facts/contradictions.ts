import { z } from "zod";
import type { TenantDb } from "../../db.ts";
import { EngramError, notFound, parseInput } from "../../errors.ts";
import type { Fact } from "../../generated/prisma/client.ts";
import { forgetFact, type ForgetDeps } from "../forget.ts";

export const CONTRADICTION_CHOICES = ["NEWER", "OLDER", "BOTH"] as const;

export const resolveContradictionInput = z.object({
  factId: z.string().min(1),
  keep: z.enum(CONTRADICTION_CHOICES),
});

export type ContradictionResolution = { kept: Fact[]; deleted: Fact | null };

const quote = (text: string) => `“${text}”`;

/**
 * A person settles a contradiction pair, named by its newer fact: keep the newer (the older is
 * deleted), keep the older (the newer is deleted), or keep both (they stop contradicting). Each
 * kept fact's history records the resolution and what it was weighed against.
 */
export async function resolveContradiction(
  db: TenantDb,
  deps: ForgetDeps,
  input: z.input<typeof resolveContradictionInput>,
  who: { apiKeyId: string },
): Promise<ContradictionResolution> {
  const { factId, keep } = parseInput(resolveContradictionInput, input);
  const newer = await db.fact.findUnique({ where: { id: factId } });
  if (!newer) throw notFound("Fact", factId);
  if (!newer.contradictsId) throw new EngramError("CONFLICT", `Fact ${factId} contradicts no other fact.`);
  const older = await db.fact.findFirst({ where: { id: newer.contradictsId, endUserId: newer.endUserId } });
  if (!older && keep === "OLDER") throw new EngramError("CONFLICT", "The older fact of this pair is already gone.");

  const drop = keep === "NEWER" ? older : keep === "OLDER" ? newer : null;
  const kept = keep === "OLDER" ? [older!] : keep === "NEWER" || !older ? [newer] : [newer, older];
  const reasonFor = (fact: Fact) => {
    const other = fact.id === newer.id ? older : newer;
    if (!other) return "contradiction resolved: the other fact was already gone";
    // The fact let go is deleted, so its text is not quoted here either.
    return keep === "BOTH" ? `contradiction resolved: both kept, with ${quote(other.text)}` : "contradiction resolved: kept over the other fact";
  };
  const reasons = new Map(kept.map((fact) => [fact.id, reasonFor(fact)]));

  if (drop) await forgetFact(db, deps, drop.id, { apiKeyId: who.apiKeyId, reason: `contradiction resolved: kept ${quote(kept[0].text)}` });
  const updated = await db.$transaction(async (tx) => {
    if (keep !== "OLDER") await tx.fact.update({ where: { id: newer.id }, data: { contradictsId: null } });
    const facts = await tx.fact.findMany({ where: { id: { in: kept.map((f) => f.id) } } });
    for (const fact of facts) {
      await tx.factVersion.create({
        data: {
          tenantId: db.$tenantId(),
          factId: fact.id,
          text: fact.text,
          core: fact.core,
          change: "RESOLVED",
          reason: reasons.get(fact.id)!,
          sourceMessageId: fact.sourceMessageId,
        },
      });
    }
    return facts;
  });
  for (const fact of updated) {
    deps.pubsub.publish("factChanged", db.$tenantId(), {
      endUserId: fact.endUserId,
      factId: fact.id,
      text: fact.text,
      change: "RESOLVED",
      reason: reasons.get(fact.id)!,
      conversationId: null,
    });
  }
  return { kept: updated, deleted: drop };
}
