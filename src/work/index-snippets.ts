import type { z } from "zod";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { createTurnSnippets, indexSnippets } from "../memory/recall/snippets.ts";
import type { indexJob } from "../queue.ts";

// The encoder embeds this many snippets at once, with one upsert to Chroma per batch.
const PER_BATCH = 64;

/**
 * Recall indexing: a recorded turn's (or an import's) messages become TURN snippets here, in the
 * worker, and every snippet named or made is embedded and upserted. Idempotent: messages that
 * already have a snippet keep it, and a vector upserted twice is the same vector.
 */
export async function runIndexSnippets(
  db: TenantDb,
  deps: Pick<Deps, "embeddings" | "vectors" | "log">,
  payload: z.infer<typeof indexJob.schema>,
) {
  const ids = [...(payload.snippetIds ?? [])];
  if (payload.conversationId && payload.firstSeq != null && payload.lastSeq != null) {
    ids.push(
      ...(await createTurnSnippets(db, payload.conversationId, { firstSeq: payload.firstSeq, lastSeq: payload.lastSeq })),
    );
  }
  let indexed = 0;
  for (let i = 0; i < ids.length; i += PER_BATCH) {
    indexed += (await indexSnippets(db, deps, ids.slice(i, i + PER_BATCH))).indexed;
  }
  deps.log.debug("recall snippets indexed", { tenantId: db.$tenantId(), indexed });
  return { indexed };
}
