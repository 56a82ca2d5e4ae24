import { z } from "zod";
import { createExtractorChain } from "../src/chains/extractor.ts";
import { createFactJudgeChain } from "../src/chains/fact-judge.ts";
import { createGateChain } from "../src/chains/gate.ts";
import { forTenant, type TenantDb } from "../src/db.ts";
import { extractFacts, type ExtractionResult } from "../src/memory/facts/extraction.ts";
import { forgetMatching, forgetUser } from "../src/memory/facts/facts.ts";
import { gateMessage } from "../src/memory/gate/gate.ts";
import type { Services } from "../src/services.ts";
import { defineJob } from "./define.ts";
import { indexFactKeys } from "./index-snippets.ts";

export const turnJob = defineJob({
  name: "memory.turn",
  schema: z.object({ tenantId: z.string(), turnId: z.string() }),
});

export const extractJob = defineJob({
  name: "memory.extract",
  schema: z.object({ tenantId: z.string(), conversationId: z.string() }),
});

/** The gate model for a tenant, or null (then the keyword gate decides). */
export async function gateChainFor(services: Services, tenantId: string) {
  const model = await services.models.chat(tenantId, "cheap", "gate");
  return model ? createGateChain(model) : null;
}

async function runExtraction(services: Services, db: TenantDb, tenantId: string, conversationId: string, now: boolean) {
  const [extractor, judge] = await Promise.all([
    services.models.chat(tenantId, "cheap", "extract"),
    services.models.chat(tenantId, "cheap", "fact-judge"),
  ]);
  if (!extractor || !judge) return { status: "MODEL_OFF" as const };
  const result = await extractFacts(
    db,
    {
      extractor: createExtractorChain(extractor),
      judge: createFactJudgeChain(judge),
      pubsub: services.pubsub,
      log: services.log,
    },
    conversationId,
    { now },
  );
  if (result.status === "EXTRACTED" && result.outcomes.some((o) => o.factId && o.change !== "REFRESHED")) {
    await indexFactKeys(services, tenantId, conversationId);
  }
  return result;
}

/**
 * After a turn: the gate's verdict on the user's message (the one context assembly already
 * asked for, or a new one), then forgetting what the user asked to forget, then extraction when
 * the gate says the turn is worth remembering or a batch is full.
 */
export async function runTurnWork(services: Services, payload: z.infer<typeof turnJob.schema>) {
  const db = forTenant(services.db, payload.tenantId);
  const turn = await db.turn.findUnique({ where: { id: payload.turnId } });
  if (!turn) return { status: "GONE" as const };
  const [userMessage, conversation] = await Promise.all([
    db.message.findFirst({ where: { conversationId: turn.conversationId, seq: turn.firstSeq, role: "USER" } }),
    db.conversation.findUniqueOrThrow({ where: { id: turn.conversationId } }),
  ]);
  if (!userMessage) return { status: "NO_USER_MESSAGE" as const };

  const verdict = await gateMessage(
    db,
    { gate: await gateChainFor(services, payload.tenantId), log: services.log },
    { conversationId: turn.conversationId, message: userMessage.content },
  );
  const deps = { pubsub: services.pubsub, recall: services.recallForgetter };
  if (verdict.forget !== "NONE") {
    const forgotten =
      verdict.forget === "ALL"
        ? await forgetUser(db, deps, conversation.endUserId, "the user asked to forget everything", turn.conversationId)
        : await forgetMatching(db, deps, conversation.endUserId, verdict.forgetTargets, turn.conversationId);
    // Forgetting also marks the user's unread messages as read, so nothing said before the
    // request is extracted again.
    return { status: "FORGOT" as const, verdict, forgotten };
  }
  const extraction: ExtractionResult | { status: "MODEL_OFF" } = await runExtraction(
    services,
    db,
    payload.tenantId,
    turn.conversationId,
    verdict.remember,
  );
  // Another extraction of this conversation is running and may not have read this turn: try again
  // later (the gate's verdict is stored, so the retry costs no second gate call).
  if (extraction.status === "BUSY") throw new Error("extraction of this conversation is running; retrying later");
  return { status: "DONE" as const, verdict, extraction };
}

/** Extraction until caught up, for imported conversations; `stillAlive` keeps the job's lock between rounds. */
export async function runExtractAll(
  services: Services,
  payload: z.infer<typeof extractJob.schema>,
  stillAlive: () => Promise<unknown> = async () => {},
) {
  const db = forTenant(services.db, payload.tenantId);
  for (let rounds = 0; rounds < 1_000; rounds++) {
    const result = await runExtraction(services, db, payload.tenantId, payload.conversationId, true);
    if (result.status === "BUSY") throw new Error("extraction of this conversation is running; retrying later");
    if (result.status !== "EXTRACTED") return result;
    await stillAlive();
  }
}
