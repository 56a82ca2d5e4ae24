import { afterAll, beforeAll, expect, it } from "vitest";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { factsScript } from "./helpers/scripted-memory-model.ts";
import { until } from "./helpers/until.ts";

const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { conversation { id endUser { id } } } }`;

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
  const say = (conversation: string, id: string, userMessage: string) =>
    engram.gql(RECORD, {
      input: { agentExternalId: "concierge", endUserExternalId: "sam", conversationExternalId: conversation, clientTurnId: id, userMessage, assistantMessage: "Noted." },
    }, engram.tenant.writer);
  const first = await say("sam-1", "s1", "Hi! I prefer window seats on every flight.");
  const endUserId = first.data.recordTurn.conversation.endUser.id;
  await until("a fact to be extracted", async () => (await engram.services.db.fact.count({ where: { endUserId } })) > 0);
  const second = await say("sam-2", "s2", "Book me a flight to Rome.");
  const { data } = await engram.gql(
    `query($input: ContextInput!) { context(input: $input) { blocks { kind text } } }`,
    { input: { conversationId: second.data.recordTurn.conversation.id, message: "Any seat preference?" } },
    engram.tenant.reader,
  );
  const facts = data.context.blocks.find((b: { kind: string }) => b.kind === "FACTS");
  expect(facts.text).toBe("- The user said: Hi! I prefer window seats on every flight.");
  // One gate call for the first turn's message, shared by every gate.
  const gateCalls = model.requests.filter((r) => r.chain === "triage");
  expect(gateCalls.filter((r) => r.messages[1].content.includes("window seats"))).toHaveLength(1);
});
