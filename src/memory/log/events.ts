import { randomUUID } from "node:crypto";
import { z } from "zod";
import { isRefusedData, type TenantDb } from "../../db.ts";
import type { Deps } from "../../deps.ts";
import { parseInput } from "../../errors.ts";
import type { MemoryEvent, Prisma } from "../../generated/prisma/client.ts";
import { LIMITS, pastMomentSchema, scopeRefSchema, scopeSchema } from "../../limits.ts";

export const appendEventInput = z.object({
  scope: scopeSchema,
  scopeRef: scopeRefSchema,
  kind: z.string().trim().min(1).max(LIMITS.kindMaxChars),
  body: z.string().min(1).max(LIMITS.bodyMaxChars),
  source: z.string().trim().min(1).max(LIMITS.sourceMaxChars),
  sourceRef: z.string().trim().min(1).max(LIMITS.sourceRefMaxChars).nullish(),
  occurredAt: pastMomentSchema.nullish(),
});

export type AppendEventInput = z.input<typeof appendEventInput>;

/**
 * Appends an immutable event. Appending the same source + sourceRef again returns the first
 * event and creates nothing, so callers can retry safely.
 */
export async function appendEvent(
  db: TenantDb,
  deps: Pick<Deps, "pubsub">,
  input: AppendEventInput,
): Promise<{ event: MemoryEvent; created: boolean }> {
  const appended = await insertEvent(db, input);
  if (appended.created) {
    const { id, scope, scopeRef } = appended.event;
    deps.pubsub.publish("eventAppended", db.$tenantId(), { id, scope, scopeRef });
  }
  return appended;
}

type EventRow = {
  id: string;
  scope: string;
  scopeRef: string;
  kind: string;
  body: string;
  source: string;
  sourceRef: string | null;
  occurredAt: string;
  createdAt: string;
};

type Waiting = { row: EventRow; resolve(inserted: MemoryEvent | null): void; reject(error: unknown): void };
type Batch = { waiting: Waiting[]; out: boolean };

/**
 * Group commit, per tenant: one insert of a tenant's appends is out at a time, and the appends
 * that arrive while it is out go together as the next one (one statement, however many rows).
 * A lone append is sent at once; under load, what each append pays in statement round trips,
 * driver work and the store's per-statement cost is shared by the batch. Raw SQL: Prisma's create
 * would first run its WASM query compiler, about 0.7 ms of CPU an append (src/db.ts, insertRows).
 */
const batches = new WeakMap<TenantDb, Batch>();
/** At most this many rows a statement, and their bodies at most this many characters (one row always goes). */
const BATCH_ROWS = 100;
const BATCH_BODY_CHARS = 1_000_000;

function insertBatched(db: TenantDb, row: EventRow): Promise<MemoryEvent | null> {
  let batch = batches.get(db);
  if (!batch) batches.set(db, (batch = { waiting: [], out: false }));
  const inserted = new Promise<MemoryEvent | null>((resolve, reject) => batch.waiting.push({ row, resolve, reject }));
  if (!batch.out) void sendBatches(db, batch);
  return inserted;
}

/** The next statement's rows, first come first. */
function nextBatch(waiting: Waiting[]): Waiting[] {
  let count = 0;
  let chars = 0;
  while (count < waiting.length && count < BATCH_ROWS && (count === 0 || chars + waiting[count].row.body.length <= BATCH_BODY_CHARS)) {
    chars += waiting[count].row.body.length;
    count++;
  }
  return waiting.splice(0, count);
}

async function sendBatches(db: TenantDb, batch: Batch) {
  batch.out = true;
  try {
    while (batch.waiting.length) await send(db, nextBatch(batch.waiting));
  } finally {
    batch.out = false;
  }
}

/** One statement for the rows; each caller gets its row, or null where its sourceRef was taken. */
async function send(db: TenantDb, sent: Waiting[]) {
  try {
    const inserted = new Map((await insertEventRows(db, sent.map((w) => w.row))).map((e) => [e.id, e]));
    for (const w of sent) w.resolve(inserted.get(w.row.id) ?? null);
  } catch (error) {
    // A row the store refuses (a NUL, say) must not fail the others: each alone again, in
    // order, so the first of two with one sourceRef is still the one stored. Any other failure
    // (the store away, the pool closed) is every row's: sent again, they would only wait
    // twice, or be stored twice if the statement committed and only its answer was lost.
    if (sent.length > 1 && isRefusedData(error)) for (const w of sent) await send(db, [w]);
    else for (const w of sent) w.reject(error);
  }
}

/**
 * With a sourceRef, ON CONFLICT DO NOTHING keeps a concurrent retry from failing or duplicating
 * (within one batch too: of two rows with one sourceRef, the first in the batch is inserted, as
 * jsonb_to_recordset gives them in order); without one nothing can conflict (NULLs are distinct
 * in the unique index). No transaction around it.
 */
function insertEventRows(db: TenantDb, rows: EventRow[]) {
  return db.$queryRaw<MemoryEvent[]>`
    INSERT INTO "MemoryEvent" ("id", "tenantId", "scope", "scopeRef", "kind", "body", "source", "sourceRef", "occurredAt", "createdAt")
    SELECT r."id", ${db.$tenantId()}, r."scope", r."scopeRef", r."kind", r."body", r."source", r."sourceRef", r."occurredAt", r."createdAt"
    FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS r("id" text, "scope" "Scope", "scopeRef" text,
      "kind" text, "body" text, "source" text, "sourceRef" text, "occurredAt" timestamp(3), "createdAt" timestamp(3))
    ON CONFLICT ("tenantId", "source", "sourceRef") DO NOTHING
    RETURNING "id", "tenantId", "scope", "scopeRef", "kind", "body", "source", "sourceRef", "occurredAt", "createdAt", "compressedAt", "entryId"`;
}

async function insertEvent(db: TenantDb, input: AppendEventInput): Promise<{ event: MemoryEvent; created: boolean }> {
  const { occurredAt, sourceRef, ...fields } = parseInput(appendEventInput, input);
  const now = new Date();
  const inserted = await insertBatched(db, {
    ...fields,
    id: randomUUID(),
    sourceRef: sourceRef ?? null,
    occurredAt: (occurredAt ?? now).toISOString(),
    createdAt: now.toISOString(),
  });
  if (inserted) return { event: inserted, created: true };
  if (!sourceRef) throw new Error("An event without a sourceRef was not inserted.");
  const first = await db.memoryEvent.findFirstOrThrow({ where: { source: fields.source, sourceRef } });
  return { event: first, created: false };
}

export const listEventsInput = z.object({
  scope: scopeSchema.nullish(),
  scopeRef: scopeRefSchema.nullish(),
  kind: z.string().trim().min(1).max(LIMITS.kindMaxChars).nullish(),
  includeCompressed: z.boolean().nullish(),
});

/** The where clause of an events listing: newest first, compressed ones only on request. */
export function eventsWhere(input: z.input<typeof listEventsInput>): Prisma.MemoryEventWhereInput {
  const { scope, scopeRef, kind, includeCompressed } = parseInput(listEventsInput, input);
  return {
    ...(scope ? { scope } : {}),
    ...(scopeRef ? { scopeRef } : {}),
    ...(kind ? { kind } : {}),
    ...(includeCompressed ? {} : { compressedAt: null }),
  };
}
