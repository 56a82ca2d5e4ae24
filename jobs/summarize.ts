import { summarizeJob } from "../src/queue.ts";
import { runSummarize, SUMMARIZE_DEBOUNCE_MS } from "../src/work/summarize.ts";
import { untilItWorks } from "./backoff.ts";
import { implementTenantJob } from "./implement.ts";

export const summarize = implementTenantJob(
  summarizeJob,
  async (db, deps, payload, control) => {
    const outcome = await runSummarize(db, deps, payload);
    // The coalesced job is one row per conversation; a request made while it ran was written to
    // this very row and would be cleared when the run is saved. Scheduling the row again keeps it.
    if (outcome.more) control.runAgainIn(SUMMARIZE_DEBOUNCE_MS);
  },
  { backoff: untilItWorks, concurrency: 4 },
);
