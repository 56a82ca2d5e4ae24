import { createRedisEventTarget } from "@graphql-yoga/redis-event-target";
import { createPubSub } from "graphql-yoga";
import { Redis } from "ioredis";
import type { SnippetKind } from "./generated/prisma/client.ts";

/**
 * Every topic is keyed by tenant id, so a subscriber can only ever hear its own tenant.
 * Payloads carry ids; subscription fields re-read rows through the tenant-scoped client.
 */
export type Topics = {
  eventAppended: [tenantId: string, payload: { id: string; scope: string; scopeRef: string }];
  entryChanged: [
    tenantId: string,
    payload: { id: string; scope: string; scopeRef: string; change: EntryChange; entry?: unknown },
  ];
  jobRunChanged: [tenantId: string, payload: { id: string }];
  summaryChanged: [tenantId: string, payload: { conversationId: string; revisionId: string }];
  turnRecorded: [tenantId: string, payload: { turnId: string; agentId: string; conversationId: string }];
  /** A recall is not stored: its payload is the whole record (candidates, scores, chosen). */
  memoryRecall: [tenantId: string, payload: RecallEvent];
  factChanged: [tenantId: string, payload: FactChangePayload];
};

/** One recall candidate as the inspector shows it: its scores from each retriever and the judge. */
export type RecallCandidate = {
  snippetId: string;
  kind: SnippetKind;
  text: string;
  conversationId: string;
  messageIds: string[];
  /** The sequence numbers of messageIds in their conversation, in the same order. */
  messageSeqs: number[];
  occurredAt: Date;
  /** Cosine similarity to the message, and rank among the vector hits (from 1). */
  vectorScore: number | null;
  vectorRank: number | null;
  /** Okapi BM25 score of the full-text match (over the user's snippets), and rank among the keyword hits. */
  keywordScore: number | null;
  keywordRank: number | null;
  /** Reciprocal rank fusion of the two ranks (the keyword side weighted, RECALL). */
  fusedScore: number;
  /** The re-rank judge's 0–3, when it ran. */
  judgeScore: number | null;
  chosen: boolean;
};

/** A recall as it happened: the candidates, how they were chosen, and why vector search was skipped. */
export type RecallEvent = {
  id: string;
  endUserId: string;
  conversationId: string | null;
  message: string;
  at: Date;
  candidates: RecallCandidate[];
  /** "JUDGE" when the re-ranker chose, "FLOOR" when the similarity floor did (no model). */
  chosenBy: "JUDGE" | "FLOOR";
  /** Why vector search was skipped (Chroma or the embedder down), when it was. */
  degraded: string | null;
};

export type EntryChange = "CREATED" | "CORRECTED" | "FORGOTTEN";

export type FactChangeKind = "ADDED" | "REFRESHED" | "UPDATED" | "CONTRADICTED" | "CORRECTED" | "DELETED" | "FORGOTTEN";

/** A fact change; `text` is kept so a deleted fact can still be shown in the live record. */
export type FactChangePayload = {
  endUserId: string;
  factId: string | null;
  change: FactChangeKind;
  reason: string;
  text: string | null;
  conversationId: string | null;
};

export type PubSub = ReturnType<typeof createPubSub<Topics>> & {
  close(): Promise<void>;
  /** Resolves once every announcement made so far has been passed on (a recording wrapper may hold them briefly). */
  settled(): Promise<void>;
};

/** In-process, or through Redis so a mutation on one instance reaches subscribers on another. */
export function createEngramPubSub(redisUrl?: string): PubSub {
  if (!redisUrl) return Object.assign(createPubSub<Topics>(), { close: async () => {}, settled: async () => {} });
  const publishClient = new Redis(redisUrl, { lazyConnect: false, maxRetriesPerRequest: 3 });
  const subscribeClient = new Redis(redisUrl, { lazyConnect: false, maxRetriesPerRequest: 3 });
  const pubsub = createPubSub<Topics>({
    eventTarget: createRedisEventTarget({ publishClient, subscribeClient }),
  });
  return Object.assign(pubsub, {
    settled: async () => {},
    async close() {
      await Promise.allSettled([publishClient.quit(), subscribeClient.quit()]);
    },
  });
}
