import { spawnSync } from "node:child_process";
import { closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { expectRecovered, faultLoad, startFaultEngram } from "../helpers/fault-engram.ts";
import { ensureCompiled, ROOT } from "../helpers/server-process.ts";
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

// A start that cannot use its data folder says so in one line naming the folder (no stack), exits
// 1 and leaves nothing half-made behind: a full disk at the first start and before it, a file in the way.
describe.skipIf(!mountable)("a start on a data folder it cannot use", () => {
  let mountPoint: string;
  beforeAll(() => {
    ensureCompiled();
    mountPoint = mkdtempSync(path.join(tmpdir(), "engram-small-"));
    // Room for the data folder's own files, not for a new database (~40 MB).
    expect(spawnSync("mount", ["-t", "tmpfs", "-o", "size=20m", "tmpfs", mountPoint]).status).toBe(0);
  });
  afterAll(() => {
    spawnSync("umount", ["-l", mountPoint]);
    rmSync(mountPoint, { recursive: true, force: true });
  });

  const start = (dataDir: string) =>
    spawnSync(process.execPath, ["dist/main.js"], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 120_000,
      env: { PATH: process.env.PATH, ENGRAM_DATA_DIR: dataDir, PORT: "0", ENGRAM_LOG_LEVEL: "warn" },
    });
  const lastLine = (stderr: string) => stderr.trim().split("\n").pop();

  it("says what is wrong and with which folder, in one line", async () => {
    const fresh = path.join(mountPoint, "fresh");
    const first = start(fresh);
    expect(first.status, first.stderr).toBe(1);
    expect(first.stderr).toMatch(/creating the embedded database in .* failed: no space left on device \(ENOSPC\)/);
    expect(lastLine(first.stderr)).toBe(`The embedded database in ${fresh}/pg exited during start-up (code 1); its lines above say why.`);
    expect(first.stderr).not.toMatch(/\[object Object\]|^\s+at /m);
    // What the database's creation wrote is gone: on a full disk it is what fills it.
    expect(readdirSync(fresh)).toEqual(["store.secret"]);

    fillDisk(path.join(mountPoint, "filler"));
    const full = path.join(mountPoint, "full");
    const before = start(full);
    expect(before.status, before.stderr).toBe(1);
    expect(before.stderr.trim()).toMatch(new RegExp(`^The data folder ${full} \\(ENGRAM_DATA_DIR\\) cannot be used: ENOSPC: no space left on device, write\\. Give Engram a folder`));
    expect(readdirSync(full)).toEqual([]);

    writeFileSync(path.join(mountPoint, "a-file"), "");
    const inTheWay = start(path.join(mountPoint, "a-file", "data"));
    expect(inTheWay.status).toBe(1);
    expect(inTheWay.stderr.trim()).toMatch(/^The data folder .*a-file\/data \(ENGRAM_DATA_DIR\) cannot be used: ENOTDIR: not a directory, mkdir/);
  });
});
