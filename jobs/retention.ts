import { retentionJob } from "../src/queue.ts";
import { retentionSweep } from "../src/work/retention.ts";
import { untilItWorks } from "./backoff.ts";
import { implementJob } from "./implement.ts";

// A tenant's run that failed is queued again on its own (retentionSweep), and retried until it works.
export const retention = implementJob(retentionJob, (deps, payload) => retentionSweep(deps, payload), {
  backoff: untilItWorks,
  every: { interval: "0 3 * * *" },
});
