import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { bagOfWords } from "./helpers/fake-embeddings.ts";
import type { ModelServer } from "./helpers/model-server.ts";
import { recordTurn } from "./helpers/turns.ts";

// Aliases let one request run `recall` or `context` several times, each spending model calls:
// one budget of model calls (chat + embeddings) per request covers all of its fields.
let model: ModelServer;
let engram: TestEngram;
let endUserId = "";
let conversationId = "";

const recalls = (n: number) =>
  `query($input: RecallInput!) { ${Array.from({ length: n }, (_, i) => `r${i}: recall(input: $input) { degraded candidates { snippetId } }`).join(" ")} }`;
const contexts = (n: number) =>
  `query($input: ContextInput!) { ${Array.from({ length: n }, (_, i) => `c${i}: context(input: $input) { blocks { kind } }`).join(" ")} }`;
const SETTINGS = `mutation($input: UpdateTenantSettingsInput!) { updateTenantSettings(input: $input) { modelCallsPerRequest } }`;

/** The embedding requests the model server received while `run` ran. */
async function embeddingCalls<T>(run: () => Promise<T>): Promise<[T, number]> {
  const before = model.embeddingRequests.length;
  const result = await run();
  return [result, model.embeddingRequests.length - before];
}

beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    embed: (input) => input.map((text) => bagOfWords(text)),
    // Every request reads its key (and so the tenant's limit) afresh: a settings change applies at once here.
    env: { ENGRAM_EMBEDDING_MODEL: "scripted-embed", ENGRAM_MODEL_CALLS_PER_REQUEST: "2", ENGRAM_KEY_CACHE_TTL_MS: "0" },
  }));
  const turn = await recordTurn(engram, { agentExternalId: "mb", endUserExternalId: "mb-user", conversationExternalId: "mb-c", userMessage: "I ordered a blue vase.", assistantMessage: "Noted." });
  endUserId = turn.conversation.endUser.id;
  conversationId = turn.conversation.id;
}, 120_000);
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

describe("a model-call budget per request", () => {
  const recallInput = () => ({ input: { endUserId, text: "the blue vase", mode: "HYBRID" } });

  it("fields share it: two recalls fit in 2 calls, a third is refused with MODEL_CALL_LIMIT before it is sent", async () => {
    const [fits, two] = await embeddingCalls(() => engram.gql(recalls(2), recallInput(), engram.tenant.reader));
    expect(fits.errors).toBeUndefined();
    expect(two).toBe(2);

    const [over, sent] = await embeddingCalls(() => engram.gql(recalls(3), recallInput(), engram.tenant.reader));
    // The refused field fails the operation at once; the other two may still be on their way.
    expect(sent).toBeLessThanOrEqual(2);
    expect(over.errors).toHaveLength(1);
    expect(over.errors![0].extensions).toMatchObject({ code: "MODEL_CALL_LIMIT", limit: 2 });
    expect(over.errors![0].message).toMatch(/used its 2 model calls/);
  });

  it("is per request: the next request has its whole budget again", async () => {
    const { errors } = await engram.gql(recalls(2), recallInput(), engram.tenant.reader);
    expect(errors).toBeUndefined();
  });

  it("context's recall does not hide it behind its fallbacks", async () => {
    // Keywords say this needs recall: each context embeds the message once.
    const input = { input: { conversationId, message: "Same as last time, please." } };
    const [one, calls] = await embeddingCalls(() => engram.gql(contexts(1), input, engram.tenant.reader));
    expect(one.errors).toBeUndefined();
    expect(calls).toBe(1);
    const over = await engram.gql(contexts(3), input, engram.tenant.reader);
    expect(over.errors?.map((e) => e.extensions?.code)).toEqual(["MODEL_CALL_LIMIT"]);
  });

  it("a tenant may lower it, never raise it past the server's", async () => {
    const lowered = await engram.gql(SETTINGS, { input: { modelCallsPerRequest: 1 } });
    expect(lowered.data.updateTenantSettings.modelCallsPerRequest).toBe(1);
    const refused = await engram.gql(recalls(2), recallInput(), engram.tenant.reader);
    expect(refused.errors?.[0].extensions).toMatchObject({ code: "MODEL_CALL_LIMIT", limit: 1 });
    // The other tenant keeps the server's limit.
    const other = await engram.gql(`{ viewer { role } }`, {}, engram.other.reader);
    expect(other.errors).toBeUndefined();

    await engram.gql(SETTINGS, { input: { modelCallsPerRequest: 50 } });
    const capped = await engram.gql(recalls(3), recallInput(), engram.tenant.reader);
    expect(capped.errors?.[0].extensions).toMatchObject({ code: "MODEL_CALL_LIMIT", limit: 2 });

    const reset = await engram.gql(SETTINGS, { input: { modelCallsPerRequest: null } });
    expect(reset.data.updateTenantSettings.modelCallsPerRequest).toBeNull();
    expect((await engram.gql(recalls(2), recallInput(), engram.tenant.reader)).errors).toBeUndefined();
  });

  it("refuses a limit out of range with BAD_USER_INPUT, changing nothing", async () => {
    const { errors } = await engram.gql(SETTINGS, { input: { modelCallsPerRequest: 0 } });
    expect(errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    const { data } = await engram.gql(`{ tenantSettings { modelCallsPerRequest } }`);
    expect(data.tenantSettings.modelCallsPerRequest).toBeNull();
  });
});
