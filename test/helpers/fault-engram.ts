import { startEngramWithModel, type TestEngram } from "./engram.ts";
import { scriptFaultyModel } from "./faulty-model.ts";
import { startModelServer, type ModelServer } from "./model-server.ts";
import type { TestStore } from "./store.ts";
import { startWriteLoad, untilFollowUpsDone, verifyAcknowledged, type WriteLoad } from "./write-load.ts";

/**
 * The Engram of a fault test: its worker running every turn's follow-ups against a scripted memory
 * model (embeddings included), serving HTTP on loopback for the write load.
 */
export async function startFaultEngram(options: { env?: Record<string, string>; store?: TestStore } = {}) {
  const model = await startModelServer();
  const faults = scriptFaultyModel(model);
  const { engram } = await startEngramWithModel({
    model,
    worker: true,
    store: options.store,
    env: { ENGRAM_EMBEDDINGS: "openai", ...options.env },
  });
  const url = await engram.listen();
  return { model, faults, engram, url, stop: () => stopFaultEngram(engram, model) };
}

/**
 * After the store was killed under load, a database client caught mid-query can stay checked
 * out, and close() gives up on it after its 5 s, saying so: that is logged here, not failed,
 * since what these suites check (no write lost or doubled) was checked before.
 */
async function stopFaultEngram(engram: TestEngram, model: ModelServer) {
  try {
    await engram.stop().catch((error: Error) => {
      if (!/^not .* within \d+ s$/.test(error.message)) throw error;
      console.warn(`fault suite: closing after the fault: ${error.message}`);
    });
  } finally {
    await model.stop();
  }
}

/** Write load from 6 clients on 6 conversations; a failed write is retried with its id for a while. */
export const faultLoad = (engram: TestEngram, url: string, tag: string) =>
  startWriteLoad({ url, key: engram.tenant.writer, clients: 6, conversations: 6, tag, retries: 20 });

/** After the fault: every acknowledged write stored once, seq gapless, and every follow-up done. */
export async function expectRecovered(engram: TestEngram, load: WriteLoad, timeoutMs = 180_000): Promise<string[]> {
  const problems = await verifyAcknowledged(engram.services.store.url, engram.tenant.tenantId, load.acked);
  if (problems.length) return problems;
  await untilFollowUpsDone(engram.services.store.url, engram.tenant.tenantId, timeoutMs);
  return [];
}
