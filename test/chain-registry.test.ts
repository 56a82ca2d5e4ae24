import { RunCollectorCallbackHandler } from "@langchain/core/tracers/run_collector";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chainFor, chains, type ChainName } from "../src/chains/registry.ts";
import { openAIChatModel, type ChatModel, type ChatRole } from "../src/models/metered.ts";
import { startModelServer, type ModelServer } from "./helpers/model-server.ts";
import { scriptedModel } from "./helpers/scripted-model.ts";

describe("the chain registry", () => {
  it("asks for the model of the chain's role under the chain's name, and is off without one", async () => {
    const asked: [ChatRole, string][] = [];
    const off = { chat: async (_tenantId: string, role: ChatRole, chain: string) => (asked.push([role, chain]), null) };
    expect(await chainFor(off, "t-1", "compactor")).toBeNull();
    expect(await chainFor(off, "t-1", "triage")).toBeNull();
    expect(asked).toEqual([["compaction", "compactor"], ["cheap", "triage"]]);
  });

  it("names each chain's run with its registered name", async () => {
    const { model } = scriptedModel(['{"remember": false, "forget": "NONE", "needsRecall": false}']);
    const models = { chat: async (): Promise<ChatModel> => model };
    const runs = new RunCollectorCallbackHandler();
    const triage = (await chainFor(models, "t-1", "triage"))!;
    expect(await triage.invoke({ message: "hi" }, { callbacks: [runs] })).toMatchObject({ forget: "NONE" });
    expect(runs.tracedRuns.map((r) => r.name)).toEqual(["triage"]);
  });

  it("registers every chain once, on the cheap or the compaction route", () => {
    expect(Object.entries(chains).map(([name, spec]) => [name, spec.role])).toEqual<[ChainName, ChatRole][]>([
      ["summary", "cheap"],
      ["loss-judge", "cheap"],
      ["verbatim-judge", "cheap"],
      ["triage", "cheap"],
      ["extract", "cheap"],
      ["fact-judge", "cheap"],
      ["rerank", "cheap"],
      ["compactor", "compaction"],
    ]);
  });
});

describe("the chain name on the wire", () => {
  let server: ModelServer;
  beforeAll(async () => {
    server = await startModelServer();
  });
  afterAll(() => server.stop());

  it("is sent as the X-Engram-Chain header of each chat request, outside the prompt", async () => {
    server.respond(() => "ok");
    const model = openAIChatModel({ baseUrl: server.url, model: "m" }, { timeoutMs: 5_000, maxRetries: 0, chain: "rerank" });
    await model.invoke("Which snippet?");
    expect(server.requests.map((r) => r.chain)).toEqual(["rerank"]);
    expect(JSON.stringify(server.requests[0].messages)).not.toContain("rerank");
  });
});
