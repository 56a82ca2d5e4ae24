import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { expectRecovered, faultLoad, startFaultEngram } from "../helpers/fault-engram.ts";
import { until } from "../helpers/until.ts";
import { reconcileRecall } from "../../src/work/reconcile.ts";

// kill -9 of the embedded Chroma wrapper under write load: writes never notice, the next use
// starts one new Chroma on the same folder, and indexing catches up, every snippet with its vector.
vi.setConfig({ testTimeout: 300_000, hookTimeout: 120_000 });

let fault: Awaited<ReturnType<typeof startFaultEngram>>;
beforeAll(async () => {
  fault = await startFaultEngram();
});
afterAll(() => fault?.stop());

describe("kill -9 of the Chroma wrapper under write load", () => {
  it("loses no write, and every snippet gets its vector once Chroma is back", async () => {
    const { engram, url } = fault;
    const load = faultLoad(engram, url, "chroma");
    try {
      await load.untilAcked(20);
      const first = await until("the embedded Chroma", async () => {
        const chroma = await engram.services.chroma.get();
        return chroma.pid ? chroma : undefined;
      });
      process.kill(first.pid!, "SIGKILL");
      await until("the Chroma wrapper to be gone", async () => !first.alive(), 10_000);
      const acked = load.acked.turns.length + load.acked.events.length;
      await load.untilAcked(acked + 30);
      await load.stop();
      for (const op of ["recordTurn", "appendEvent"] as const) {
        expect(load.stats[op].errors + load.stats[op].timeouts, load.stats[op].errorSamples.join("; ")).toBe(0);
      }
      expect(await expectRecovered(engram, load)).toEqual([]);
      const again = await engram.services.chroma.get();
      expect(again.pid).not.toBe(first.pid);
      // Every snippet's vector is there. An upsert Chroma acknowledged just before the kill can die
      // with it (seen once in 50): the reconcile sweep (every minute) finds it and indexes it again.
      const ids = (await engram.services.db.recallSnippet.findMany({ where: { tenantId: engram.tenant.tenantId }, select: { id: true } })).map((s) => s.id);
      const requeued = await reconcileRecall(engram.services.deps, { tenantId: engram.tenant.tenantId }, { graceMs: 0 });
      if (requeued[engram.tenant.tenantId]) console.warn(`chroma-kill: reconcile re-queued ${requeued[engram.tenant.tenantId]} snippets`);
      await until("every snippet's vector in Chroma", async () => (await engram.services.vectors.count(engram.tenant.tenantId, { ids })) === ids.length, 60_000);
    } finally {
      await load.stop();
    }
  });
});
