import { reconcileRecall } from "../../src/work/reconcile.ts";
import { startEngramWithModel, type TestEngram } from "./engram.ts";
import { scriptFaultyModel } from "./faulty-model.ts";
import { startModelServer, type ModelServer } from "./model-server.ts";
import type { TestStore } from "./store.ts";
import { until } from "./until.ts";
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

/**
 * Every snippet of the tenant has its vector in Chroma, after Chroma (or the process it ran in)
 * was killed: an upsert Chroma acknowledged just before the kill can die with it (seen once in
 * 50), and the reconcile sweep (every minute) finds it and indexes it again.
 */
export async function expectEveryVector(engram: TestEngram, tag: string): Promise<void> {
  // The snippets are read again at each look: follow-ups still running after the load delete
  // snippets, and their vectors with them (a summary rewrite replaces its conversation's
  // SUMMARY keys with new ones; extraction can drop a fact's key), and a deleted row needs no
  // vector. Read once, such a row stayed "missing" until the wait ran out (a CI run, 38decd4).
  const tenantId = engram.tenant.tenantId;
  const { model } = await engram.services.deps.embeddings.forTenant(tenantId);
  /** The snippets there now without their vector, and how many snippets there are. */
  const missing = async () => {
    const snippets = await engram.services.db.recallSnippet.findMany({ where: { tenantId }, select: { id: true } });
    const ids = snippets.map((s) => s.id);
    const present = await engram.services.vectors.present({ tenantId, model }, ids);
    return { left: ids.filter((id) => !present.has(id)), total: ids.length };
  };
  // The sweep runs every minute in production; here every 5 s until every vector is there.
  // No time bound is the claim, so the wait is a generous 180 s, and each sweep says how many
  // are still missing, for a slow run to show. (An earlier timeout at 60 s, d1dfc5f, had the
  // signature of a deleted row too: nothing re-queued and nothing missing a moment later.)
  let swept = 0;
  const started = Date.now();
  try {
    await until("every snippet's vector in Chroma", async () => {
      const { left, total } = await missing();
      if (Date.now() - swept > 5_000) {
        swept = Date.now();
        const requeued = await reconcileRecall(engram.services.deps, { tenantId }, { graceMs: 0 });
        if (requeued[tenantId]) console.warn(`${tag}: reconcile re-queued ${requeued[tenantId]} snippets`);
        if (left.length) console.warn(`${tag}: ${left.length} of ${total} vectors missing after ${Math.round((Date.now() - started) / 1000)} s`);
      }
      return left.length === 0;
    }, 180_000);
  } catch (error) {
    // What is left says which step did not happen: re-queued, indexed, or the vector stored.
    const left = await engram.services.db.recallSnippet.findMany({
      where: { id: { in: (await missing()).left } },
      select: { id: true, kind: true, indexedAt: true, embeddingModel: true, createdAt: true },
    });
    console.warn(`${tag}: without a vector after 180 s: ${JSON.stringify(left)}`);
    throw error;
  }
}
