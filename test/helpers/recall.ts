import { ChromaClient } from "chromadb";
import { Prisma } from "../../src/generated/prisma/client.ts";
import { readFileSync } from "node:fs";
import path from "node:path";
import type { TestEngram } from "./engram.ts";
import { recordTurn } from "./turns.ts";
import { until } from "./until.ts";

export const IMPORT = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id lastSeq endUser { id } } }`;
export const CONTEXT = `query($input: ContextInput!) { context(input: $input) { totalTokens degraded blocks { kind title text tokens items { id text tokens score } } } }`;
export const RECALL = `query($input: RecallInput!) { recall(input: $input) { degraded candidates { snippetId kind text conversationId messageIds messageSeqs vectorScore vectorRank keywordScore keywordRank fusedScore } } }`;

/** Records a turn and returns the ids a test needs. */
export async function say(
  engram: TestEngram,
  who: { user: string; conversation: string; agent?: string },
  userMessage: string,
  assistantMessage?: string,
  key?: string,
) {
  const turn = await recordTurn(
    engram,
    { agentExternalId: who.agent ?? "shop", endUserExternalId: who.user, conversationExternalId: who.conversation, userMessage, assistantMessage },
    key,
  );
  return { turnId: turn.id, conversationId: turn.conversation.id, endUserId: turn.conversation.endUser.id };
}

/** For end-to-end tests that wait on the worker's indexing while other suites share the CPU. */
export const INDEXING_TIMEOUT_MS = 150_000;

/**
 * Waits until every turn of the tenant has its snippets and every snippet its vector: no turn
 * waits for its follow-ups to be queued, no follow-ups or indexing job is queued or running (a
 * queued turn job has yet to make its snippets; Agenda clears a one-off job's next_run_at when it
 * starts, so a running one is told by its lock), and no snippet lacks a vector. `alsoJobs` names
 * more of the tenant's jobs to wait out, such as "memory.summarize" when a test's next check must
 * not race a summary revision.
 */
export function allIndexed(engram: TestEngram, tenantId = engram.tenant.tenantId, timeoutMs = 30_000, alsoJobs: readonly string[] = []) {
  const db = engram.services.db;
  return until(
    "every snippet to be indexed",
    async () => {
      const [total, pending, waitingTurns, [{ queued }]] = await Promise.all([
        db.recallSnippet.count({ where: { tenantId } }),
        db.recallSnippet.count({ where: { tenantId, indexedAt: null } }),
        db.turn.count({ where: { tenantId, followUpsQueuedAt: null } }),
        db.$queryRaw<{ queued: number }[]>`
          SELECT count(*)::int AS queued FROM "agenda_jobs"
          WHERE "name" IN (${Prisma.join(["recall.index", "memory.turn", "memory.follow-ups", ...alsoJobs])}) AND "data"->>'tenantId' = ${tenantId}
            AND ("next_run_at" IS NOT NULL OR "locked_at" IS NOT NULL)`,
      ]);
      return total > 0 && pending === 0 && waitingTurns === 0 && queued === 0;
    },
    timeoutMs,
  );
}

/** A client of the embedded Chroma the test Engram started, for checking vectors directly. */
export function chromaOf(engram: TestEngram): ChromaClient {
  const dataDir = engram.services.env.ENGRAM_DATA_DIR;
  const { port } = JSON.parse(readFileSync(path.join(dataDir, "chroma.owner.json"), "utf8")) as { port: number };
  return new ChromaClient({ host: "127.0.0.1", port });
}

/** The ids of the vectors Chroma holds for a tenant, across its collections, matching `where`. */
export async function vectorIds(chroma: ChromaClient, tenantId: string, where?: Record<string, unknown>): Promise<string[]> {
  const ids: string[] = [];
  for (const collection of await chroma.listCollections({ limit: 1000 })) {
    if (!collection.name.startsWith(`engram-${tenantId}-`)) continue;
    ids.push(...(await collection.get({ ...(where ? { where: where as never } : {}), include: [] })).ids);
  }
  return ids.sort();
}
