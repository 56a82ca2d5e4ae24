import { z } from "zod";
import { appNow, type TenantDb } from "../../db.ts";
import type { Deps } from "../../deps.ts";
import { parseInput } from "../../errors.ts";
import type { MemoryEvent, Prisma } from "../../generated/prisma/client.ts";
import { LIMITS, scopeRefSchema, scopeSchema } from "../../limits.ts";

export const appendEventInput = z.object({
  scope: scopeSchema,
  scopeRef: scopeRefSchema,
  kind: z.string().trim().min(1).max(LIMITS.kindMaxChars),
  body: z.string().min(1).max(LIMITS.bodyMaxChars),
  source: z.string().trim().min(1).max(LIMITS.sourceMaxChars),
  sourceRef: z.string().trim().min(1).max(LIMITS.sourceRefMaxChars).nullish(),
  occurredAt: z.date().nullish(),
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

async function insertEvent(db: TenantDb, input: AppendEventInput): Promise<{ event: MemoryEvent; created: boolean }> {
  const { occurredAt, sourceRef, ...fields } = parseInput(appendEventInput, input);
  const data = {
    ...fields,
    tenantId: db.$tenantId(),
    sourceRef: sourceRef ?? null,
    occurredAt: occurredAt ?? new Date(),
  };
  // One raw statement either way: Prisma's create would first run its WASM query compiler, about
  // 0.7 ms of CPU an append (src/db.ts, insertRows). With a sourceRef, ON CONFLICT DO NOTHING
  // keeps a concurrent retry from failing or duplicating; without one nothing can conflict (NULLs
  // are distinct in the unique index). No transaction around it.
  const [inserted] = await db.$queryRaw<MemoryEvent[]>`
    INSERT INTO "MemoryEvent" ("id", "tenantId", "scope", "scopeRef", "kind", "body", "source", "sourceRef", "occurredAt", "createdAt")
    VALUES (gen_random_uuid()::text, ${data.tenantId}, ${data.scope}::"Scope", ${data.scopeRef}, ${data.kind}, ${data.body},
            ${data.source}, ${data.sourceRef}, ${data.occurredAt.toISOString()}::timestamp(3), ${appNow()})
    ON CONFLICT ("tenantId", "source", "sourceRef") DO NOTHING
    RETURNING "id", "tenantId", "scope", "scopeRef", "kind", "body", "source", "sourceRef", "occurredAt", "createdAt", "compressedAt", "entryId"`;
  if (inserted) return { event: inserted, created: true };
  if (!data.sourceRef) throw new Error("An event without a sourceRef was not inserted.");
  const first = await db.memoryEvent.findFirstOrThrow({
    where: { source: data.source, sourceRef: data.sourceRef },
  });
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
