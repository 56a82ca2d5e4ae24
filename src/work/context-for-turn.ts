import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { parseInput } from "../errors.ts";
import { assembleContext, contextInput as contextInputSchema, type ContextInput } from "../memory/context.ts";
import { factsBlocks } from "../memory/facts/facts.ts";
import { parseCallerVerdict, storeCallerVerdict } from "../memory/gate/gate.ts";
import { decideRecallLocally } from "../memory/gate/recall-intent.ts";
import { recallBlocks } from "../memory/recall/recall.ts";

/**
 * The `context` query: facts, recall, entries, summary, kept messages and the tail for the
 * agent's next model call. It never waits on a chat model to decide recall: the caller's
 * verdict (`gate`) decides, else the local gate (whether the message is nearer the recall
 * prototypes than the no-recall ones), whose embedding the recall search reuses. A writer's
 * verdict is stored for the turn's background work; without one, the model gate runs there,
 * after the reply.
 */
export async function contextForTurn(
  db: TenantDb,
  deps: Pick<Deps, "models" | "embeddings" | "vectors" | "pubsub" | "log">,
  input: ContextInput & { gate?: unknown },
  /**
   * `storeVerdict`: whether the caller's verdict is kept for the turn (a WRITER or ADMIN key). A
   * reader's decides recall for this answer only: stored, it would steer the turn's background
   * work, whose "forget" verdicts delete the user's memory.
   */
  options: { storeVerdict: boolean },
) {
  const { gate, ...contextInput } = input;
  const verdict = gate == null ? null : parseCallerVerdict(gate);
  const decide = verdict ? async () => ({ needsRecall: verdict.needsRecall }) : startLocalDecision(db, deps, contextInput);
  const context = await assembleContext(db, contextInput, [factsBlocks(db), recallBlocks(db, deps, { decide })]);
  // A conversation with no turn yet has nowhere to keep it: recordTurn's `gate` carries it then.
  if (verdict && options.storeVerdict && context.conversationId) {
    await storeCallerVerdict(db, { conversationId: context.conversationId, message: input.message, verdict });
  }
  return context;
}

/**
 * The local recall decision, started at once: it needs only the message, so its embedding runs
 * alongside the read of the conversation and its settings rather than after it. For an agent
 * whose recall is off, or a conversation that is not found, that embedding is made for nothing,
 * and like every embedding it counts toward the request's model-call budget (only the offline
 * encoder's: with other embedders the local decision embeds nothing). The input is checked
 * first, so a message that is too long is refused before anything is embedded.
 */
function startLocalDecision(db: TenantDb, deps: Pick<Deps, "embeddings">, input: ContextInput) {
  const { message } = parseInput(contextInputSchema, input);
  const decision = decideRecallLocally(deps, db.$tenantId(), message);
  // The recall producer awaits it and logs a failure; nobody does when the read fails first.
  decision.catch(() => undefined);
  return () => decision;
}
