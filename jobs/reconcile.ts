import { deleteVectorsJob, reconcileJob } from "../src/queue.ts";
import { deleteOwedVectors, reconcileRecall } from "../src/work/reconcile.ts";
import { untilItWorks } from "./backoff.ts";
import { implementJob } from "./implement.ts";

export const reconcile = implementJob(reconcileJob, (deps, payload) => reconcileRecall(deps, payload), {
  every: { interval: "1 minute" },
});

export const deleteVectors = implementJob(deleteVectorsJob, (deps, payload) => deleteOwedVectors(deps, payload), { backoff: untilItWorks });
