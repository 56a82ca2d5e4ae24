import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { expectEveryVector, expectRecovered, faultLoad, startFaultEngram } from "../helpers/fault-engram.ts";
import { serverUrl } from "../helpers/store.ts";
import { until } from "../helpers/until.ts";
import { startEmbeddedChroma, type ChromaServer } from "../../src/embedded/chroma.ts";

// kill -9 of Chroma's process under write load: writes never notice, Chroma comes back on the
// same folder, and indexing catches up, every snippet with its vector. On PostgreSQL that process
// is the wrapper Engram starts, and Engram's next use starts one new Chroma. On the embedded store
// Chroma is a thread of the database's process, which is killed by test/faults/store-kill.test.ts:
// here the embedded pass kills a Chroma server of its own process (CHROMA_URL) and starts it again.
vi.setConfig({ testTimeout: 300_000, hookTimeout: 120_000 });

let fault: Awaited<ReturnType<typeof startFaultEngram>>;
let external: { dir: string; chroma: ChromaServer } | undefined;
beforeAll(async () => {
  if (!serverUrl) {
    const dir = mkdtempSync(path.join(tmpdir(), "engram-chroma-kill-"));
    external = { dir, chroma: await startEmbeddedChroma(dir) };
  }
  fault = await startFaultEngram(external ? { env: { CHROMA_URL: external.chroma.url } } : {});
});
afterAll(async () => {
  await fault?.stop();
  if (external) {
    await external.chroma.stop();
    rmSync(external.dir, { recursive: true, force: true });
  }
});

describe("kill -9 of Chroma's process under write load", () => {
  it("loses no write, and every snippet gets its vector once Chroma is back", async () => {
    const { engram, url } = fault;
    const load = faultLoad(engram, url, "chroma");
    try {
      await load.untilAcked(20);
      const first =
        external?.chroma ??
        (await until("the embedded Chroma", async () => {
          const chroma = await engram.services.chroma.get();
          return chroma.pid ? chroma : undefined;
        }));
      process.kill(first.pid!, "SIGKILL");
      await until("Chroma's process to be gone", async () => !first.alive(), 10_000);
      const acked = load.acked.turns.length + load.acked.events.length;
      await load.untilAcked(acked + 30);
      if (external) external.chroma = await startEmbeddedChroma(external.dir, { port: Number(new URL(first.url).port) });
      await load.stop();
      for (const op of ["recordTurn", "appendEvent"] as const) {
        expect(load.stats[op].errors + load.stats[op].timeouts, load.stats[op].errorSamples.join("; ")).toBe(0);
      }
      expect(await expectRecovered(engram, load)).toEqual([]);
      const again = external?.chroma ?? (await engram.services.chroma.get());
      expect(again.pid).not.toBe(first.pid);
      await expectEveryVector(engram, "chroma-kill");
    } finally {
      await load.stop();
    }
  });
});
