import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { assembleContext, type ContextInput } from "../memory/context.ts";
import { factsBlocks } from "../memory/facts/facts.ts";
import { parseCallerVerdict, storeCallerVerdict } from "../memory/gate/gate.ts";
import { decideRecallLocally } from "../memory/gate/recall-intent.ts";
import { recallBlocks } from "../memory/recall/recall.ts";

/**
 * The `context` query: facts, recall, entries, summary, kept messages and the tail for the
 * agent's next model call. It never waits on a chat model to decide recall: the caller's
 * verdict (`gate`) decides, else the local gate (keywords, then the message's similarity to
 * recall prototypes), whose embedding the recall search reuses. A caller's verdict is stored
 * for the turn's background work; without one, the model gate runs there, after the reply.
 */
export async function contextForTurn(
  db: TenantDb,
  deps: Pick<Deps, "models" | "embeddings" | "vectors" | "pubsub" | "log">,
  input: ContextInput & { gate?: unknown },
) {
  const { gate, ...contextInput } = input;
  const verdict = gate == null ? null : parseCallerVerdict(gate);
  const decide = verdict
    ? async () => ({ needsRecall: verdict.needsRecall })
    : ({ message }: { message: string }) => decideRecallLocally(deps, db.$tenantId(), message);
  const context = await assembleContext(db, contextInput, [factsBlocks(db), recallBlocks(db, deps, { decide })]);
  // A conversation with no turn yet has nowhere to keep it: recordTurn's `gate` carries it then.
  if (verdict && context.conversationId) {
    await storeCallerVerdict(db, { conversationId: context.conversationId, message: input.message, verdict });
  }
  return context;
}
