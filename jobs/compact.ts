import { compactJob } from "../src/queue.ts";
import { COMPACTION_SWEEP_CRON, compactTenantsUntilDone } from "../src/work/compact-tenants.ts";
import { untilItWorks } from "./backoff.ts";
import { implementJob } from "./implement.ts";

// A tenant's run paused by its budget fails and is retried until the budget allows it.
export const compact = implementJob(compactJob, (deps, payload) => compactTenantsUntilDone(deps, payload), {
  backoff: untilItWorks,
  every: { interval: COMPACTION_SWEEP_CRON, payload: { due: true } },
});
