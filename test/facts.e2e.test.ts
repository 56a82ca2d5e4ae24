import { afterAll, beforeAll, expect, it } from "vitest";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { recordTurn } from "./helpers/turns.ts";
import { until } from "./helpers/until.ts";


let model: ModelServer;
let engram: TestEngram;
beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    respond: factsScript({
      triage: (m) => ({ remember: /\bI (am|prefer)\b/.test(m) }),
      extract: (messages) =>
        messages
          .filter((m) => m.role === "user" && /\bI (am|prefer)\b/.test(m.content))
          .map((m) => ({ text: `The user said: ${m.content}`, seq: m.seq, core: true })),
    }),
  }));
});
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

it("a user's fact from conversation 1 is in the FACTS block of conversation 2, through the job queue and the real OpenAI client", async () => {
  const say = (conversation: string, userMessage: string) =>
    recordTurn(engram, { agentExternalId: "concierge", endUserExternalId: "sam", conversationExternalId: conversation, userMessage, assistantMessage: "Noted." }, engram.tenant.writer);
  const first = await say("sam-1", "Hi! I prefer window seats on every flight.");
  const endUserId = first.conversation.endUser.id;
  await until("a fact to be extracted", async () => (await engram.services.db.fact.count({ where: { endUserId } })) > 0);
  const second = await say("sam-2", "Book me a flight to Rome.");
  const { data } = await engram.gql(
    `query($input: ContextInput!) { context(input: $input) { blocks { kind text } } }`,
    { input: { conversationId: second.conversation.id, message: "Any seat preference?" } },
    engram.tenant.reader,
  );
  const facts = data.context.blocks.find((b: { kind: string }) => b.kind === "FACTS");
  expect(facts.text).toBe('- "The user said: Hi! I prefer window seats on every flight."');
  // One gate call for the first turn's message, shared by every gate.
  const gateCalls = model.requests.filter((r) => r.chain === "triage");
  expect(gateCalls.filter((r) => r.messages[1].content.includes("window seats"))).toHaveLength(1);
});
