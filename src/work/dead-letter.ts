import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { ModelCallError } from "../models/egress.ts";
import { recordJobRun } from "./job-runs.ts";

/** How often work whose model answer could not be read is tried before it is dead-lettered. */
export const UNREADABLE_TRIES = 5;

/**
 * The model answered, but nothing in the answer could be read. The work is retried with the
 * queue's backoff (a model's next answer often parses), and after UNREADABLE_TRIES it is
 * dead-lettered: a FAILED job run says what gave up, visible in jobRuns and the inspector.
 */
export class UnreadableAnswer extends Error {
  constructor(
    readonly what: string,
    why = "the model's answer could not be read",
  ) {
    super(`${what}: ${why}`);
    this.name = "UnreadableAnswer";
  }
}

/**
 * The work's model call, with a call that no retry can change (ModelCallError "refused": the
 * provider refused the request as it is, the batch being past the model's context, say; or a route
 * that is not allowed) counted as an unreadable answer: retried for ever as an outage, it made a
 * model call a minute for ever and held the conversation's extraction or summary behind it without
 * a word in jobRuns. An outage (5xx, a timeout, 429) stays one: it only delays.
 */
export async function refusalsCounted<T>(what: string, call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (error) {
    if (error instanceof ModelCallError && error.kind === "refused") throw new UnreadableAnswer(what, error.message);
    throw error;
  }
}

/** Records the dead letter as a job run; its result names the work by ids only, never content. */
export async function deadLetter(
  db: TenantDb,
  deps: Pick<Deps, "pubsub" | "log">,
  job: { name: string; payload: Record<string, unknown>; tries: number },
  error: UnreadableAnswer,
) {
  deps.log.error("work dead-lettered after model answers it could not use", { job: job.name, tries: job.tries, reason: error.message, payload: job.payload });
  const ids = Object.fromEntries(Object.entries(job.payload).filter(([key]) => key.endsWith("Id")));
  await recordJobRun(db, deps.pubsub, job.name, async () => ({
    status: "FAILED",
    result: { deadLetter: true, tries: job.tries, reason: error.message, ...ids },
  }));
}
