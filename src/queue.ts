import { z } from "zod";

/**
 * The durable work queue as the domain sees it: job definitions (a name and one payload schema,
 * shared by whoever enqueues and the worker that runs) and a way to enqueue them. The Agenda
 * implementation lives in src/agenda-queue.ts, the worker in jobs/worker.ts, the job bodies in src/work/.
 */
export type JobDefinition<S extends z.ZodType = z.ZodType> = { name: string; schema: S };

export function defineJob<S extends z.ZodType>(definition: JobDefinition<S>): JobDefinition<S> {
  return definition;
}

export type JobQueue = {
  /** One job, run now, or `delayMs` from now. */
  enqueue<S extends z.ZodType>(job: JobDefinition<S>, payload: z.input<S>, options?: { delayMs?: number }): Promise<void>;
  /** One run for a burst: submissions with the same key within `debounceMs` become one job. */
  enqueueCoalesced<S extends z.ZodType>(
    job: JobDefinition<S>,
    payload: z.input<S> & Record<string, unknown>,
    key: string,
    debounceMs: number,
  ): Promise<void>;
  /**
   * At most one job per key and window from this process, run at the window's end: every write
   * committed before a skipped call is seen by the job already queued (a queue write per burst,
   * not per call).
   */
  enqueueSoon<S extends z.ZodType>(
    job: JobDefinition<S>,
    payload: z.input<S> & Record<string, unknown>,
    key: string,
    windowMs: number,
  ): Promise<void>;
  /**
   * Of `values`, those for which a job of this kind keyed by them waits to run (queued or due for
   * a retry, not running); `exceptJobId` leaves one job out (the asking job's own).
   */
  waiting(job: JobDefinition, key: string, values: string[], exceptJobId?: string): Promise<Set<string>>;
  /** Of `values`, those with such a job waiting, which is made due now (a retry on its backoff, say). */
  hurry(job: JobDefinition, key: string, values: string[]): Promise<Set<string>>;
  close(): Promise<void>;
};

/** A running job worker (jobs/worker.ts starts one). */
export type Worker = { stop(graceMs?: number): Promise<void> };

const tenantScoped = { tenantId: z.string() };
// No tenant: every active tenant, as the schedule runs it.
const allTenants = z.object({ tenantId: z.string().optional() }).default({});

/** The follow-ups of every turn of a tenant still in the outbox, in batches: snippets, their vectors, summary requests, the gate. */
export const followUpsJob = defineJob({ name: "memory.follow-ups", schema: z.object({ ...tenantScoped }) });

/**
 * A turn's follow-ups: recall snippets, the summary request, the gate and extraction (imported
 * turns, forget requests of agents that do not extract, and those the dispatcher catches up).
 */
export const turnJob = defineJob({ name: "memory.turn", schema: z.object({ ...tenantScoped, turnId: z.string() }) });

/**
 * The gate on a conversation's turns not yet judged, in order (and what they ask to forget), then
 * extraction (work/turn-work.ts, runConversationTurnsWork).
 */
export const conversationTurnsJob = defineJob({
  name: "memory.conversation-turns",
  schema: z.object({ ...tenantScoped, conversationId: z.string() }),
});

/** Extraction until caught up (imported conversations, quiet conversations). */
export const extractJob = defineJob({
  name: "memory.extract",
  schema: z.object({ ...tenantScoped, conversationId: z.string() }),
});

/** Seed 003's quiet-period timer: one pending run per conversation, pushed back by every new turn. */
export const quietExtractJob = defineJob({
  name: "memory.extract-quiet",
  schema: z.object({ ...tenantScoped, conversationId: z.string() }),
});

export const summarizeJob = defineJob({
  name: "memory.summarize",
  schema: z.object({ ...tenantScoped, conversationId: z.string() }),
});

/** Embeds snippets: the given ones, or a conversation's messages in a range (creating their snippets). */
export const indexJob = defineJob({
  name: "recall.index",
  schema: z.object({
    ...tenantScoped,
    snippetIds: z.array(z.string()).max(256).optional(),
    conversationId: z.string().optional(),
    firstSeq: z.number().int().optional(),
    lastSeq: z.number().int().optional(),
  }),
});

export const reconcileJob = defineJob({ name: "recall.reconcile", schema: allTenants });

/** Vectors a forget could not delete (the store down or not answering): deleted once it answers. */
export const deleteVectorsJob = defineJob({
  name: "recall.delete-vectors",
  schema: z.object({
    ...tenantScoped,
    selector: z.object({
      ids: z.array(z.string()).optional(),
      endUserId: z.string().optional(),
      conversationId: z.string().optional(),
      occurredBefore: z.coerce.date().optional(),
    }),
  }),
});

export const retentionJob = defineJob({ name: "memory.retention", schema: allTenants });

export const compactJob = defineJob({
  name: "memory.compact",
  // due: only tenants whose own compaction schedule has come round since their last run.
  schema: z.object({ tenantId: z.string().optional(), due: z.boolean().optional() }).default({}),
});

/** The outbox: turns whose follow-ups were never queued (a crash between commit and enqueue). */
export const dispatchJob = defineJob({ name: "memory.dispatch", schema: z.object({}).default({}) });
