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
  constructor(readonly what: string) {
    super(`${what}: the model's answer could not be read`);
    this.name = "UnreadableAnswer";
  }
}

/**
 * Whether a failure counts towards the work's dead letter: an unreadable answer, or a call that
 * no retry can change (ModelCallError "refused": the provider refused the request as it is, 400,
 * 413 or 422, say a batch too long for a small model's context; or a route that is not allowed).
 * Retried for ever, such a call made a model call a minute for ever and held the conversation's
 * extraction or summary behind it without a word in jobRuns. An outage (5xx, a timeout, 429)
 * does not count: it only delays.
 */
export const countsTowardsDeadLetter = (error: unknown): error is Error =>
  error instanceof UnreadableAnswer || (error instanceof ModelCallError && error.kind === "refused");

/** Records the dead letter as a job run; its result names the work by ids only, never content. */
export async function deadLetter(
  db: TenantDb,
  deps: Pick<Deps, "pubsub" | "log">,
  job: { name: string; payload: Record<string, unknown>; tries: number },
  error: Error,
) {
  deps.log.error("work dead-lettered after model answers it could not use", { job: job.name, tries: job.tries, reason: error.message, payload: job.payload });
  const ids = Object.fromEntries(Object.entries(job.payload).filter(([key]) => key.endsWith("Id")));
  await recordJobRun(db, deps.pubsub, job.name, async () => ({
    status: "FAILED",
    result: { deadLetter: true, tries: job.tries, reason: error.message, ...ids },
  }));
}
