import { backoffStrategies, type BackoffStrategy } from "agenda";
import { ExtractionBusy } from "../src/work/turn-work.ts";

const growing = backoffStrategies.exponential({ delay: 1_000, maxDelay: 300_000, maxRetries: 1_000_000 });

// A lease is held for the seconds one extraction takes; a crashed holder's runs out (LEASE_MS).
const BUSY_RETRY_MS = 2_000;

/**
 * Model outages and crashes delay work, never lose it: retry with growing delays, without end.
 * A run that found the conversation's extraction running elsewhere is no outage: it is retried
 * within 2–4 s every time. Growing delays there left a soak's turns waiting minutes behind a
 * lease that was long free (bench/README.md, "Soak").
 */
export const untilItWorks: BackoffStrategy = (context) =>
  context.error instanceof ExtractionBusy ? BUSY_RETRY_MS * (1 + Math.random()) : growing(context);

/** Indexing retries for a couple of minutes; after that the reconcile job picks the snippets up. */
export const untilReconciled = backoffStrategies.exponential({ delay: 1_000, maxDelay: 60_000, maxRetries: 7 });
