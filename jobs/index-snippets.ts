import { indexJob } from "../src/queue.ts";
import { runIndexSnippets } from "../src/work/index-snippets.ts";
import { untilReconciled } from "./backoff.ts";
import { implementTenantJob } from "./implement.ts";

export const indexSnippets = implementTenantJob(indexJob, (db, deps, payload) => runIndexSnippets(db, deps, payload), {
  backoff: untilReconciled,
  concurrency: 2,
});
