import { backoffStrategies } from "agenda";

/** Model outages and crashes delay work, never lose it: retry with growing delays, without end. */
export const untilItWorks = backoffStrategies.exponential({ delay: 1_000, maxDelay: 300_000, maxRetries: 1_000_000 });

/** Indexing retries for a couple of minutes; after that the reconcile job picks the snippets up. */
export const untilReconciled = backoffStrategies.exponential({ delay: 1_000, maxDelay: 60_000, maxRetries: 7 });
