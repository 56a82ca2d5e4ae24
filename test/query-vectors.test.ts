import { FakeEmbeddings } from "@langchain/core/utils/testing";
import { afterAll, describe, expect, it, vi } from "vitest";
import { createEmbeddingsProvider } from "../src/embeddings/index.ts";
import { OFFLINE_MODEL, OfflineEmbeddings } from "../src/embeddings/offline.ts";
import { readEnv } from "../src/env.ts";
import { decideRecallLocally } from "../src/memory/gate/recall-intent.ts";

// The query vectors the offline embedder keeps (context, then recall, embed the same message),
// and the recall prototypes' vectors, which every tenant of the offline encoder shares.
describe("kept query vectors", { timeout: 120_000 }, () => {
  let clock = 0;
  const unused = { embeddings: async () => Promise.reject(new Error("no remote embedder in this test")) };
  const provider = createEmbeddingsProvider(readEnv({ ENGRAM_EMBEDDINGS: "offline" }), unused, () => clock);
  const encoder = vi.spyOn(OfflineEmbeddings.prototype, "embedQuery");
  afterAll(async () => {
    encoder.mockRestore();
    await provider.close();
  });
  const embed = async (tenantId: string, text: string) => (await provider.forTenant(tenantId)).embeddings.embedQuery(text);

  it("answer the same tenant's text again from memory, and never another tenant's", async () => {
    const text = "Did I tell you the code to my storage unit?";
    const first = await embed("tenant-a", text);
    expect(await embed("tenant-a", text)).toEqual(first);
    expect(encoder).toHaveBeenCalledTimes(1);
    // The same text from another tenant is embedded again: how fast it is answered tells nothing
    // of what the first tenant's users said.
    expect(await embed("tenant-b", text)).toEqual(first);
    expect(encoder).toHaveBeenCalledTimes(2);
  });

  it("of a tenant go when a forget asks, the other tenants' stay", async () => {
    encoder.mockClear();
    const text = "My locker is number 4312.";
    await embed("tenant-a", text);
    await embed("tenant-b", text);
    provider.forgetQueries("tenant-a");
    await embed("tenant-a", text);
    await embed("tenant-b", text);
    expect(encoder).toHaveBeenCalledTimes(3);
  });

  it("are used for ten minutes at most", async () => {
    encoder.mockClear();
    const text = "Book the usual table for Friday.";
    await embed("tenant-a", text);
    clock += 10 * 60_000 - 1;
    await embed("tenant-a", text);
    expect(encoder).toHaveBeenCalledTimes(1);
    clock += 1;
    await embed("tenant-a", text);
    expect(encoder).toHaveBeenCalledTimes(2);
  });
});

describe("the local recall decision", () => {
  it("compares with the recall prototypes only through the offline encoder, whatever another embedder's model is called", async () => {
    // A tenant's own route whose model is named like the offline encoder: its vectors must not
    // become the prototypes every tenant shares, so only the keywords decide.
    const remote = new FakeEmbeddings();
    const embedded = vi.spyOn(remote, "embedDocuments");
    const queried = vi.spyOn(remote, "embedQuery");
    const provider = {
      forTenant: async () => ({ embeddings: remote, model: OFFLINE_MODEL, similarityFloor: 0.25, offline: false }),
      forgetQueries: () => {},
      close: async () => {},
    };
    expect(await decideRecallLocally({ embeddings: provider }, "tenant-a", "What did I order last time?")).toEqual({
      needsRecall: true,
      vector: null,
      decidedBy: "KEYWORDS",
    });
    expect(embedded).not.toHaveBeenCalled();
    expect(queried).not.toHaveBeenCalled();
  });
});
