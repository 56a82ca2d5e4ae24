import { randomUUID } from "node:crypto";
import { insertRows, type ColumnTypes, type TenantDb } from "../db.ts";
import { badInput } from "../errors.ts";
import type { ModelUsageRecord } from "../models/metered.ts";
import type { ModelPrice } from "./settings.ts";

/** Purposes are named as in the seeds: memory:<model>. */
export const purposeOf = (model: string) => `memory:${model}`;

export async function recordModelUsage(db: TenantDb, usage: ModelUsageRecord & { redactions?: number }) {
  await recordModelUsages(db, [usage]);
}

const USAGE_COLUMNS: ColumnTypes = {
  id: "text",
  purpose: "text",
  chain: "text",
  model: "text",
  inputTokens: "integer",
  outputTokens: "integer",
  redactions: "integer",
  createdAt: "timestamp(3)",
};

/** Several calls' rows, stored together (insertRows). */
export async function recordModelUsages(db: TenantDb, usages: (ModelUsageRecord & { redactions?: number })[]) {
  const createdAt = new Date();
  const rows = usages.map(({ chain, model, inputTokens, outputTokens, redactions }) => ({
    id: randomUUID(),
    purpose: purposeOf(model),
    chain,
    model,
    inputTokens,
    outputTokens,
    redactions: redactions ?? 0,
    createdAt,
  }));
  await insertRows(db, "ModelUsage", USAGE_COLUMNS, rows);
}

export const USAGE_GROUPS = ["PURPOSE", "CHAIN", "MODEL", "DAY", "TENANT"] as const;
export type UsageGroup = (typeof USAGE_GROUPS)[number];

export type UsageRow = {
  purpose: string | null;
  chain: string | null;
  model: string | null;
  /** YYYY-MM-DD (UTC) */
  day: string | null;
  tenantId: string | null;
  calls: number;
  inputTokens: number;
  outputTokens: number;
  redactions: number;
  /** USD for the tokens whose model has a price; null when none has. */
  costUsd: number | null;
  /** Tokens of models without a price, not in costUsd. */
  unpricedTokens: number;
};

export type UsageReport = Omit<UsageRow, "purpose" | "chain" | "model" | "day" | "tenantId"> & { rows: UsageRow[] };

type Bucket = { purpose: string; chain: string; model: string; day: string; calls: number; input: number; output: number; redactions: number };

/** USD for one model's tokens: prices are per 1M input and per 1M output tokens. */
export function costOf(price: ModelPrice, inputTokens: number, outputTokens: number): number {
  return (inputTokens * price.inputPerMillion + outputTokens * price.outputPerMillion) / 1_000_000;
}

// Timestamps are stored as UTC without a zone; parameters are passed the same way.
const utc = (date: Date) => date.toISOString().replace("Z", "");

/**
 * Tokens, calls, redactions and cost of this tenant's memory work over [from, to), grouped by
 * any of purpose, chain, model, day (UTC) and tenant. Fields not grouped by come back null.
 */
export async function modelUsageReport(
  db: TenantDb,
  input: { from?: Date | null; to?: Date | null; groupBy?: readonly UsageGroup[] | null },
  prices: Record<string, ModelPrice>,
): Promise<UsageReport> {
  const { from, to } = input;
  if (from && to && from >= to) throw badInput("`from` must be before `to`.");
  const groupBy = new Set<UsageGroup>(input.groupBy ?? ["PURPOSE", "CHAIN", "MODEL"]);
  // float8, not bigint (a BigInt to JavaScript): exact up to 2^53, as far as the SafeInt totals go.
  const buckets = await db.$queryRawUnsafe<Bucket[]>(
    `SELECT "purpose", "chain", "model", to_char(date_trunc('day', "createdAt"), 'YYYY-MM-DD') AS "day",
            count(*)::float8 AS "calls", sum("inputTokens")::float8 AS "input",
            sum("outputTokens")::float8 AS "output", sum("redactions")::float8 AS "redactions"
       FROM "ModelUsage"
      WHERE "tenantId" = $1
        AND ($2::timestamp IS NULL OR "createdAt" >= $2::timestamp)
        AND ($3::timestamp IS NULL OR "createdAt" < $3::timestamp)
      GROUP BY 1, 2, 3, 4`,
    db.$tenantId(),
    from ? utc(from) : null,
    to ? utc(to) : null,
  );

  const rows = new Map<string, UsageRow>();
  const total: UsageReport = { calls: 0, inputTokens: 0, outputTokens: 0, redactions: 0, costUsd: null, unpricedTokens: 0, rows: [] };
  for (const bucket of buckets) {
    const row: UsageRow = {
      purpose: groupBy.has("PURPOSE") ? bucket.purpose : null,
      chain: groupBy.has("CHAIN") ? bucket.chain : null,
      model: groupBy.has("MODEL") ? bucket.model : null,
      day: groupBy.has("DAY") ? bucket.day : null,
      tenantId: groupBy.has("TENANT") ? db.$tenantId() : null,
      calls: 0,
      inputTokens: 0,
      outputTokens: 0,
      redactions: 0,
      costUsd: null,
      unpricedTokens: 0,
    };
    const key = JSON.stringify([row.purpose, row.chain, row.model, row.day, row.tenantId]);
    const target = rows.get(key) ?? (rows.set(key, row), row);
    const price = prices[bucket.model];
    for (const into of [target, total]) {
      into.calls += bucket.calls;
      into.inputTokens += bucket.input;
      into.outputTokens += bucket.output;
      into.redactions += bucket.redactions;
      if (price) into.costUsd = (into.costUsd ?? 0) + costOf(price, bucket.input, bucket.output);
      else into.unpricedTokens += bucket.input + bucket.output;
    }
  }
  const order = (value: string | null) => value ?? "";
  total.rows = [...rows.values()].sort(
    (a, b) =>
      order(a.day).localeCompare(order(b.day)) ||
      order(a.purpose).localeCompare(order(b.purpose)) ||
      order(a.chain).localeCompare(order(b.chain)) ||
      order(a.model).localeCompare(order(b.model)),
  );
  return total;
}
