import { reconcileJob } from "../src/queue.ts";
import { reconcileRecall } from "../src/work/reconcile.ts";
import { implementJob } from "./implement.ts";

export const reconcile = implementJob(reconcileJob, (deps, payload) => reconcileRecall(deps, payload), {
  every: { interval: "1 minute" },
});
