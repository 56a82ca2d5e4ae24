import { extractJob, followUpsJob, quietExtractJob, turnJob } from "../src/queue.ts";
import { runTurnFollowUps } from "../src/work/follow-ups.ts";
import { runExtractAll, runQuietExtraction, runTurnWork } from "../src/work/turn-work.ts";
import { untilItWorks } from "./backoff.ts";
import { implementTenantJob } from "./implement.ts";

export const turn = implementTenantJob(turnJob, (db, deps, payload) => runTurnWork(db, deps, payload), {
  backoff: untilItWorks,
  concurrency: 4,
});

export const extract = implementTenantJob(
  extractJob,
  (db, deps, payload, control) => runExtractAll(db, deps, payload, control.stillAlive),
  { backoff: untilItWorks },
);

export const quietExtract = implementTenantJob(quietExtractJob, (db, deps, payload) => runQuietExtraction(db, deps, payload), {
  backoff: untilItWorks,
});

// One batch at a time per worker: a round claims its turns, so a second would find few.
export const followUps = implementTenantJob(followUpsJob, (db, deps, _payload, control) => runTurnFollowUps(db, deps, control.stillAlive), {
  backoff: untilItWorks,
  concurrency: 1,
});
