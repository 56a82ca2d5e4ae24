import type { TenantDb } from "../db.ts";
import { badInput } from "../errors.ts";
import type { ModelUsageRecord } from "../models/index.ts";

/** Purposes are named as in the seeds: memory:<model>. */
export const purposeOf = (model: string) => `memory:${model}`;

export async function recordModelUsage(db: TenantDb, usage: ModelUsageRecord & { redactions?: number }) {
  await db.modelUsage.create({
    data: { ...usage, tenantId: db.$tenantId(), purpose: purposeOf(usage.model) },
  });
}

/** Token sums per purpose and chain over [from, to). */
export async function sumModelUsage(db: TenantDb, range: { from?: Date | null; to?: Date | null }) {
  if (range.from && range.to && range.from >= range.to) throw badInput("`from` must be before `to`.");
  const groups = await db.modelUsage.groupBy({
    by: ["purpose", "chain", "model"],
    where: { createdAt: { gte: range.from ?? undefined, lt: range.to ?? undefined } },
    _sum: { inputTokens: true, outputTokens: true },
    _count: { _all: true },
    orderBy: [{ purpose: "asc" }, { chain: "asc" }],
  });
  const rows = groups.map((group) => ({
    purpose: group.purpose,
    chain: group.chain,
    model: group.model,
    calls: group._count._all,
    inputTokens: group._sum.inputTokens ?? 0,
    outputTokens: group._sum.outputTokens ?? 0,
  }));
  const sum = (key: "inputTokens" | "outputTokens") => rows.reduce((total, r) => total + r[key], 0);
  return { rows, inputTokens: sum("inputTokens"), outputTokens: sum("outputTokens") };
}
