import { randomUUID } from "node:crypto";
import { appNow, sqlTimestamp, type TenantDb } from "../db.ts";
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
  /** The lower of the tenant's monthlyTokenBudget and the server's ceiling (ENGRAM_MONTHLY_TOKEN_BUDGET). */
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
 * The limit a tenant's calls are held to: its own monthlyTokenBudget, or the server's ceiling
 * (ENGRAM_MONTHLY_TOKEN_BUDGET, the operator's, whose key tenants may spend) where that is lower
 * or the tenant set none.
 */
export function tokenLimit(settings: Pick<EffectiveSettings, "monthlyTokenBudget">, ceiling: number | null): number | null {
  const own = settings.monthlyTokenBudget;
  if (own === null) return ceiling;
  return ceiling === null ? own : Math.min(own, ceiling);
}

/**
 * Where the tenant stands against its monthly token budget. When the limit is reached for the
 * first time in a period, that moment is stored, so `pausedSince` survives until the period
 * rolls over or the limit is raised.
 */
export async function budgetStatus(db: TenantDb, ceiling: number | null, now = new Date(), settings?: EffectiveSettings): Promise<BudgetStatus> {
  settings ??= await loadTenantSettings(db);
  const { start, end } = budgetPeriod(now);
  const spent = await tokensSpent(db, start);
  const limit = tokenLimit(settings, ceiling);
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

/** Whether an error is a model call the tenant's monthly token budget refused (budgetExhausted). */
export const isBudgetExhausted = (error: unknown): error is EngramError => error instanceof EngramError && error.code === "BUDGET_EXHAUSTED";

/**
 * Whether the tenant has spent its budget this period (budgetStatus's `paused`), without a
 * statement when it has no limit.
 */
export async function budgetSpent(db: TenantDb, ceiling: number | null, now = new Date()): Promise<boolean> {
  const settings = await loadTenantSettings(db);
  if (tokenLimit(settings, ceiling) === null) return false;
  return (await budgetStatus(db, ceiling, now, settings)).paused;
}

/** Refuses a call: the budget is spent, or what is left of it is held by calls in flight (`reserved`). */
export function budgetExhausted(status: BudgetStatus, reserved = 0) {
  const since = status.periodStart.toISOString().slice(0, 10);
  const details = { spent: status.spent, limit: status.limit, periodStart: status.periodStart.toISOString() };
  if (status.paused || reserved === 0) {
    return new EngramError(
      "BUDGET_EXHAUSTED",
      `The monthly token budget is spent (${status.spent} of ${status.limit} tokens since ${since}); ` +
        "background memory work is paused until the period rolls over or the budget is raised.",
      details,
    );
  }
  return new EngramError(
    "BUDGET_EXHAUSTED",
    `The monthly token budget has no room for another model call (${status.spent} of ${status.limit} tokens spent since ${since}, ` +
      `${reserved} more held by model calls in flight); background memory work waits until they end, the period rolls over or the budget is raised.`,
    { ...details, reserved },
  );
}

// The first key of the per-tenant advisory lock around check-and-reserve (the second is the
// tenant's hash); any constant works that no other two-key advisory lock uses.
const BUDGET_LOCK = 727_361_002;

/**
 * Holds a model call's expected tokens against the tenant's budget before the call is made, or
 * throws BUDGET_EXHAUSTED; null when the tenant has no limit (nothing is held, nothing counted).
 * A call is let through while the budget is not spent and either no other call holds tokens (a
 * lone call may overshoot, as one always could) or its tokens fit beside those spent and held.
 *
 * The check and the hold are one transaction under a per-tenant advisory lock, so concurrent
 * calls of every process take turns; the lock is held for those two statements only, never
 * during the model call. The hold is a row every process counts, until releaseBudget deletes it
 * or, if its process died, it lapses after holdMs.
 */
export async function reserveBudget(db: TenantDb, ceiling: number | null, expected: () => number, holdMs: number): Promise<string | null> {
  const settings = await loadTenantSettings(db);
  const limit = tokenLimit(settings, ceiling);
  if (limit === null) return null;
  const tokens = expected();
  const now = new Date();
  const tenantId = db.$tenantId();
  const id = randomUUID();
  // Read committed: the second statement's snapshot is taken once the lock is held, so it sees
  // every hold and usage row committed by the calls that held the lock before.
  const [, [row]] = await db.$transaction([
    db.$executeRaw`SELECT pg_advisory_xact_lock(${BUDGET_LOCK}::int, hashtext(${tenantId}))`,
    db.$queryRaw<{ spent: number; reserved: number; made: number }[]>`
      WITH lapsed AS (
        DELETE FROM "BudgetReservation" WHERE "tenantId" = ${tenantId} AND "expiresAt" <= ${appNow()}
      ), spent AS (
        SELECT coalesce(sum("inputTokens"), 0)::float8 + coalesce(sum("outputTokens"), 0)::float8 AS tokens FROM "ModelUsage"
         WHERE "tenantId" = ${tenantId} AND "createdAt" >= ${sqlTimestamp(budgetPeriod(now).start)}
      ), held AS (
        SELECT coalesce(sum("tokens"), 0)::float8 AS tokens, count(*) AS calls FROM "BudgetReservation"
         WHERE "tenantId" = ${tenantId} AND "expiresAt" > ${appNow()}
      ), made AS (
        INSERT INTO "BudgetReservation" ("id", "tenantId", "tokens", "expiresAt", "createdAt")
        SELECT ${id}, ${tenantId}, ${tokens}::int, ${sqlTimestamp(new Date(now.getTime() + holdMs))}, ${appNow()}
          FROM spent, held
         WHERE spent.tokens < ${limit}::float8
           AND (held.calls = 0 OR spent.tokens + held.tokens + ${tokens}::float8 <= ${limit}::float8)
        RETURNING 1
      )
      SELECT spent.tokens AS spent, held.tokens AS reserved, (SELECT count(*) FROM made)::int AS made FROM spent, held`,
  ]);
  if (row.made === 0) throw budgetExhausted(await budgetStatus(db, ceiling, now, settings), row.reserved);
  return id;
}

/** Gives back a call's hold, once its usage row is written (or it failed). */
export async function releaseBudget(db: TenantDb, reservationId: string): Promise<void> {
  await db.$executeRaw`DELETE FROM "BudgetReservation" WHERE "id" = ${reservationId} AND "tenantId" = ${db.$tenantId()}`;
}
