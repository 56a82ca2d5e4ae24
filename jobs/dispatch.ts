import { dispatchJob } from "../src/queue.ts";
import { dispatchPendingTurns } from "../src/work/dispatch.ts";
import { implementJob } from "./implement.ts";

export const dispatch = implementJob(dispatchJob, (deps) => dispatchPendingTurns(deps), { every: { interval: "1 minute" } });
