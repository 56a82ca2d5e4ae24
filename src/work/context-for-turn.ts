import { chainFor } from "../chains/registry.ts";
import type { TenantDb } from "../db.ts";
import type { Deps } from "../deps.ts";
import { assembleContext } from "../memory/context.ts";
import { factsBlocks } from "../memory/facts/facts.ts";
import { gateMessage } from "../memory/gate/gate.ts";
import { recallBlocks } from "../memory/recall/recall.ts";

/**
 * The `context` query: facts, recall, entries, summary, kept messages and the tail for the
 * agent's next model call. The per-turn gate's verdict is stored for the turn's background
 * work, so one verdict per message serves recall, remembering and forgetting.
 */
export function contextForTurn(
  db: TenantDb,
  deps: Pick<Deps, "models" | "embeddings" | "vectors" | "pubsub" | "log">,
  input: { conversationId: string; message: string },
) {
  const needsRecall = async (turn: { conversationId: string; message: string }) =>
    (await gateMessage(db, { triage: await chainFor(deps.models, db.$tenantId(), "triage"), log: deps.log }, turn)).needsRecall;
  return assembleContext(db, input, [factsBlocks(db), recallBlocks(db, deps, { needsRecall })]);
}
