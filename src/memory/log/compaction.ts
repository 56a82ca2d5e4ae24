import type { Runnable } from "@langchain/core/runnables";
import type { CompactedEntry, CompactorInput } from "../../chains/compactor.ts";
import type { TenantDb } from "../../db.ts";
import { EngramError, publicReason } from "../../errors.ts";
import type { Logger } from "../../log.ts";
import type { PubSub } from "../../pubsub.ts";
import { announceEntry } from "./entries.ts";

const DAY_MS = 86_400_000;
// One model call sees at most this many events; a larger bucket is compacted over several runs.
const MAX_EVENTS_PER_CALL = 200;

export type CompactionSettings = { minEvents: number; olderThanDays: number };

export type CompactionResult = {
  buckets: number;
  compacted: number;
  failed: number;
  eventsCompressed: number;
  entryIds: string[];
  errors: { scope: string; scopeRef: string; error: string }[];
};

/** The (scope, scopeRef) buckets holding enough uncompressed events older than the threshold. */
export async function findCompactionBuckets(db: TenantDb, settings: CompactionSettings, now: Date) {
  const before = new Date(now.getTime() - settings.olderThanDays * DAY_MS);
  const groups = await db.memoryEvent.groupBy({
    by: ["scope", "scopeRef"],
    where: { compressedAt: null, occurredAt: { lt: before } },
    _count: { _all: true },
    orderBy: [{ scope: "asc" }, { scopeRef: "asc" }],
  });
  return {
    before,
    buckets: groups
      .filter((group) => group._count._all >= settings.minEvents)
      .map(({ scope, scopeRef }) => ({ scope, scopeRef })),
  };
}

/**
 * Compacts one tenant's old events: one compactor call per bucket, whose entry is created and
 * whose events are marked compressed in one transaction, so a crash leaves both or neither.
 * A failing bucket is logged and left untouched for the next run; the others go on.
 */
export async function compactTenant(
  db: TenantDb,
  deps: {
    compactor: Runnable<CompactorInput, CompactedEntry>;
    pubsub: PubSub;
    log: Logger;
  },
  settings: CompactionSettings,
  now = new Date(),
): Promise<CompactionResult> {
  const tenantId = db.$tenantId();
  const { before, buckets } = await findCompactionBuckets(db, settings, now);
  const result: CompactionResult = {
    buckets: buckets.length,
    compacted: 0,
    failed: 0,
    eventsCompressed: 0,
    entryIds: [],
    errors: [],
  };
  for (const bucket of buckets) {
    try {
      const events = await db.memoryEvent.findMany({
        where: { ...bucket, compressedAt: null, occurredAt: { lt: before } },
        orderBy: [{ occurredAt: "asc" }, { id: "asc" }],
        take: MAX_EVENTS_PER_CALL,
      });
      if (events.length < settings.minEvents) continue;
      const compacted = await deps.compactor.invoke({ ...bucket, events });
      const entry = await db.$transaction(async (tx) => {
        const created = await tx.memoryEntry.create({
          data: { ...bucket, ...compacted, importance: 4, source: "COMPACTOR", tenantId },
        });
        const marked = await tx.memoryEvent.updateMany({
          where: { id: { in: events.map((e) => e.id) }, compressedAt: null },
          data: { compressedAt: now, entryId: created.id },
        });
        // Another worker compacted some of these meanwhile: roll back rather than double up.
        if (marked.count !== events.length) throw new EngramError("CONFLICT", "events changed during compaction");
        return created;
      });
      result.compacted++;
      result.eventsCompressed += events.length;
      result.entryIds.push(entry.id);
      announceEntry(db, deps, "CREATED", entry);
    } catch (error) {
      result.failed++;
      result.errors.push({ ...bucket, error: publicReason(error) });
      deps.log.warn("compaction of a bucket failed; it stays for the next run", {
        tenantId,
        ...bucket,
        error,
      });
    }
  }
  return result;
}
