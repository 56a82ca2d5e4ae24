import { retentionJob } from "../src/queue.ts";
import { retentionSweep } from "../src/work/retention.ts";
import { implementJob } from "./implement.ts";

export const retention = implementJob(retentionJob, (deps, payload) => retentionSweep(deps, payload), {
  every: { interval: "0 3 * * *" },
});
