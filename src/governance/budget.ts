import type { TenantDb } from "../db.ts";
import { EngramError } from "../errors.ts";
import { loadTenantSettings, settingsChanged, type EffectiveSettings } from "./settings.ts";

/** Budget periods are calendar months in UTC. */
export function budgetPeriod(now = new Date()) {
  const start = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1));
  const end = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1));
  return { start, end };
}

export type BudgetStatus = {
  /** Input plus output tokens of this tenant's model usage in the current period. */
  spent: number;
  limit: number | null;
  periodStart: Date;
  periodEnd: Date;
  paused: boolean;
  /** When the limit was first reached in this period, while it is still reached. */
  pausedSince: Date | null;
};

export async function tokensSpent(db: TenantDb, since: Date): Promise<number> {
  const sum = await db.modelUsage.aggregate({
    where: { createdAt: { gte: since } },
    _sum: { inputTokens: true, outputTokens: true },
  });
  return (sum._sum.inputTokens ?? 0) + (sum._sum.outputTokens ?? 0);
}

/**
 * Where the tenant stands against its monthly token budget. When the limit is reached for the
 * first time in a period, that moment is stored, so `pausedSince` survives until the period
 * rolls over or the limit is raised.
 */
export async function budgetStatus(db: TenantDb, now = new Date(), settings?: EffectiveSettings): Promise<BudgetStatus> {
  settings ??= await loadTenantSettings(db);
  const { start, end } = budgetPeriod(now);
  const spent = await tokensSpent(db, start);
  const limit = settings.monthlyTokenBudget;
  const paused = limit !== null && spent >= limit;
  let pausedSince = settings.budgetPausedSince && settings.budgetPausedSince >= start ? settings.budgetPausedSince : null;
  if (paused && !pausedSince) {
    pausedSince = now;
    // Only the first writer in a period sets it; a concurrent call keeps the earlier moment.
    await db.tenantSettings.updateMany({
      where: { tenantId: db.$tenantId(), OR: [{ budgetPausedSince: null }, { budgetPausedSince: { lt: start } }] },
      data: { budgetPausedSince: now },
    });
    settingsChanged(db.$tenantId());
  }
  return { spent, limit, periodStart: start, periodEnd: end, paused, pausedSince: paused ? pausedSince : null };
}

export const budgetExhausted = (status: BudgetStatus) =>
  new EngramError(
    "BUDGET_EXHAUSTED",
    `The monthly token budget is spent (${status.spent} of ${status.limit} tokens since ${status.periodStart.toISOString().slice(0, 10)}); ` +
      "background memory work is paused until the period rolls over or the budget is raised.",
    { spent: status.spent, limit: status.limit, periodStart: status.periodStart.toISOString() },
  );

/** Throws BUDGET_EXHAUSTED when the tenant's budget for this period is spent. */
export async function assertBudgetLeft(db: TenantDb, settings?: EffectiveSettings): Promise<void> {
  settings ??= await loadTenantSettings(db);
  if (settings.monthlyTokenBudget === null) return;
  const status = await budgetStatus(db, new Date(), settings);
  if (status.paused) throw budgetExhausted(status);
}
