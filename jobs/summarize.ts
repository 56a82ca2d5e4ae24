import { summarizeJob } from "../src/queue.ts";
import { runSummarize, SUMMARIZE_DEBOUNCE_MS } from "../src/work/summarize.ts";
import { untilItWorks } from "./backoff.ts";
import { implementTenantJob } from "./implement.ts";

export const summarize = implementTenantJob(
  summarizeJob,
  async (db, deps, payload, control) => {
    const outcome = await runSummarize(db, deps, payload);
    // What the run itself left to do (it read only up to where it started). A request made while
    // it ran is kept on this row (keepRequestsMadeDuringARun, src/agenda-queue.ts) but for one made
    // between the lock and the start's save: scheduling the row again covers that one too.
    if (outcome.more) control.runAgainIn(SUMMARIZE_DEBOUNCE_MS);
  },
  { backoff: untilItWorks, concurrency: 4 },
);
