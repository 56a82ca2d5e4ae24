import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { startEngramWithModel, type TestEngram } from "../helpers/engram.ts";
import { scriptFaultyModel, type ModelFault } from "../helpers/faulty-model.ts";
import type { ModelServer } from "../helpers/model-server.ts";
import { until } from "../helpers/until.ts";
import { startWriteLoad, untilFollowUpsDone, verifyAcknowledged } from "../helpers/write-load.ts";

// The chat model down, hanging or answering garbage while agents keep writing: writes never
// notice, and once the model is well again every turn gets its summary and its extraction.
vi.setConfig({ testTimeout: 240_000, hookTimeout: 120_000 });

let model: ModelServer;
let engram: TestEngram;
let url: string;
let faults: ReturnType<typeof scriptFaultyModel>;

beforeAll(async () => {
  ({ model, engram } = await startEngramWithModel({
    worker: true,
    // A hung call gives up after 2 s, so the fault shows within the test's time.
    env: { ENGRAM_EMBEDDINGS: "openai", ENGRAM_MODEL_TIMEOUT_MS: "2000" },
  }));
  faults = scriptFaultyModel(model);
  url = await engram.listen();
});
afterAll(async () => {
  await engram?.stop();
  await model?.stop();
});

async function underModelFault(fault: ModelFault, tag: string) {
  const load = startWriteLoad({ url, key: engram.tenant.writer, clients: 6, conversations: 6, tag });
  try {
    await load.untilAcked(12);
    const callsBefore = model.requests.length;
    faults.set(fault);
    // The fault lasts while agents write 30 more times, and until the background work has met it
    // (a conversation's gate job runs a few seconds after its turns).
    await load.untilAcked(42);
    await until("the background work to call the faulty model", async () => model.requests.length > callsBefore, 60_000).catch(() => {});
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    const callsDuringFault = model.requests.length - callsBefore;
    faults.set("none");
    await load.untilAcked(60);
    await load.stop();
    expect(callsDuringFault, "the background work met the faulty model").toBeGreaterThan(0);
    for (const op of ["recordTurn", "appendEvent"] as const) {
      expect(load.stats[op].errors + load.stats[op].timeouts, `${op}: ${load.stats[op].errorSamples.join("; ")}`).toBe(0);
    }
    expect(await verifyAcknowledged(engram.services.store.url, engram.tenant.tenantId, load.acked)).toEqual([]);
    await untilFollowUpsDone(engram.services.store.url, engram.tenant.tenantId, 180_000);
  } finally {
    faults.set("none");
    await load.stop();
  }
}

describe("the chat model down (503)", () => {
  it("loses no write, and every turn's follow-ups run once it is back", () => underModelFault("down", "down"));
});

describe("the chat model hanging (never answers)", () => {
  it("loses no write, and every turn's follow-ups run once it answers again", () => underModelFault("hanging", "hang"));
});

describe("the chat model answering garbage", () => {
  it("loses no write, and every turn's follow-ups run once its answers are readable again", () => underModelFault("garbage", "garbage"));
});
