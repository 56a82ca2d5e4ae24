import { spawnSync } from "node:child_process";
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { expectRecovered, faultLoad, startFaultEngram } from "../helpers/fault-engram.ts";
import { serverUrl, type TestStore } from "../helpers/store.ts";
import { until } from "../helpers/until.ts";

// A full disk under write load, on a real small tmpfs holding the embedded store (and its Chroma):
// writes fail while it is full, never hang, and none that was acknowledged is lost or doubled; once
// space is freed the retried writes go through and every turn gets its follow-ups.
// Mounting needs root; on PostgreSQL the disk is the database server's, so the suite runs embedded only.
vi.setConfig({ testTimeout: 300_000, hookTimeout: 120_000 });

const mountable = (() => {
  if (serverUrl || process.getuid?.() !== 0) return false;
  const probe = mkdtempSync(path.join(tmpdir(), "engram-mount-probe-"));
  const ok = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", probe]).status === 0;
  if (ok) spawnSync("umount", [probe]);
  rmSync(probe, { recursive: true, force: true });
  return ok;
})();
if (!mountable) console.warn("faults/disk-full: needs root and an embedded store to mount a tmpfs for it: skipped");

/** Writes zeros to file until the disk has no room left. */
function fillDisk(file: string) {
  const fd = openSync(file, "w");
  const chunk = Buffer.alloc(1024 * 1024);
  try {
    for (;;) writeSync(fd, chunk);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
  } finally {
    closeSync(fd);
  }
}

describe.skipIf(!mountable)("a full disk under write load", () => {
  let mountPoint: string;
  let fault: Awaited<ReturnType<typeof startFaultEngram>>;
  beforeAll(async () => {
    mountPoint = mkdtempSync(path.join(tmpdir(), "engram-full-"));
    expect(spawnSync("mount", ["-t", "tmpfs", "-o", "size=256m", "tmpfs", mountPoint]).status).toBe(0);
    const dir = path.join(mountPoint, "data");
    mkdirSync(dir);
    const store: TestStore = { kind: "embedded", vars: { ENGRAM_DATA_DIR: dir }, drop: async () => {} };
    fault = await startFaultEngram({ store });
  });
  afterAll(async () => {
    await fault?.stop();
    spawnSync("umount", ["-l", mountPoint]);
    rmSync(mountPoint, { recursive: true, force: true });
  });

  it("fails writes while full, loses no acknowledged one, and catches up once space is freed", async () => {
    const { engram, url } = fault;
    const load = faultLoad(engram, url, "full");
    try {
      await load.untilAcked(20);
      const failedBefore = load.stats.recordTurn.errors + load.stats.appendEvent.errors;
      const filler = path.join(mountPoint, "filler");
      fillDisk(filler);
      // Writes meet the full disk (PGlite extends its files as rows arrive).
      await until("a write to fail on the full disk", async () => load.stats.recordTurn.errors + load.stats.appendEvent.errors > failedBefore, 120_000);
      rmSync(filler);
      const acked = load.acked.turns.length + load.acked.events.length;
      await load.untilAcked(acked + 30);
      await load.stop();
      expect(load.stats.recordTurn.timeouts + load.stats.appendEvent.timeouts).toBe(0);
      expect(await expectRecovered(engram, load)).toEqual([]);
    } finally {
      await load.stop();
    }
  });
});
