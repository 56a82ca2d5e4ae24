import { conversationTurnsJob, extractJob, followUpsJob, quietExtractJob, turnJob } from "../src/queue.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { ExtractionBusy, runConversationTurnsWork, runExtractAll, runQuietExtraction, runTurnWork, HAND_OFF_MS, TurnBusy } from "../src/work/turn-work.ts";
import { UnreadableAnswer } from "../src/work/dead-letter.ts";
import { untilItWorks } from "./backoff.ts";
import { implementTenantJob, type JobControl } from "./implement.ts";

// A lease is held for the seconds one extraction takes; a crashed holder's runs out (LEASE_MS).
const BUSY_RETRY_MS = 2_000;

/**
 * The conversation's extraction is running elsewhere, or another worker is taking the turn out of
 * the outbox: no outage, so the same job runs again in
 * 2–4 s, not after the growing backoff (which left a soak's turns waiting minutes behind a lease
 * long free), and without counting a failure (which would shorten the next real outage's
 * retries and the unreadable-answer tries).
 */
export async function againSoonWhenBusy(control: Pick<JobControl, "runAgainIn">, work: Promise<unknown>) {
  try {
    return await work;
  } catch (error) {
    if (!(error instanceof ExtractionBusy) && !(error instanceof TurnBusy)) throw error;
    control.runAgainIn(BUSY_RETRY_MS * (1 + Math.random()));
    return { status: "BUSY" as const };
  }
}

// `retry`: this job failed before (a model outage, an unreadable answer): its extraction reads
// now, even on a partial batch (at worst one extraction more than needed).
export const turn = implementTenantJob(
  turnJob,
  (db, deps, payload, control) => againSoonWhenBusy(control, runTurnWork(db, deps, payload, { stillAlive: control.stillAlive, retry: control.attempt > 1 })),
  { backoff: untilItWorks, concurrency: 4 },
);

/** Work that left some for later (`again`) runs again in `againInMs` (HAND_OFF_MS unless it says), whatever requests came meanwhile. */
function againWhenLeft<T extends { again?: boolean; againInMs?: number }>(control: Pick<JobControl, "runAgainIn">, work: Promise<T>) {
  return work.then((done) => {
    if (done.again) control.runAgainIn(done.againInMs ?? HAND_OFF_MS);
    return done;
  });
}

// Left: turns still unjudged at the end (one its round may yet write, or come during the run).
// Failed while another gate job of the conversation waits to run: this one ends and leaves the
// turns to it. During a model outage each burst of turns (and each minute, the dispatcher) queues
// one; each retrying without end, they would pile up, and their attempts with them.
export const conversationTurns = implementTenantJob(
  conversationTurnsJob,
  (db, deps, payload, control) =>
    againSoonWhenBusy(control, againWhenLeft(control, runConversationTurnsWork(db, deps, payload, { stillAlive: control.stillAlive, retry: control.attempt > 1 }))).catch(
      async (error: unknown) => {
        // An unreadable answer goes the usual way: its tries are counted towards a dead letter.
        if (error instanceof UnreadableAnswer) throw error;
        if (!(await deps.queue.waiting(conversationTurnsJob, "conversationId", [payload.conversationId], control.jobId)).size) throw error;
        deps.log.warn("gate job failed while another of its conversation waits to run; leaving the turns to it", {
          conversationId: payload.conversationId,
          error: error instanceof Error ? error.message : String(error),
        });
        return { status: "HANDED_OVER" as const };
      },
    ),
  { backoff: untilItWorks, concurrency: 4 },
);

export const extract = implementTenantJob(
  extractJob,
  (db, deps, payload, control) => againSoonWhenBusy(control, runExtractAll(db, deps, payload, control.stillAlive)),
  { backoff: untilItWorks },
);

export const quietExtract = implementTenantJob(
  quietExtractJob,
  // Left: what a turn the gate had not judged yet held the extractor back from.
  (db, deps, payload, control) => againSoonWhenBusy(control, againWhenLeft(control, runQuietExtraction(db, deps, payload))),
  { backoff: untilItWorks },
);

// One batch at a time per worker: a round claims its turns, so a second would find few.
export const followUps = implementTenantJob(followUpsJob, (db, deps, _payload, control) => runTurnFollowUps(db, deps, control.stillAlive), {
  backoff: untilItWorks,
  concurrency: 1,
});
