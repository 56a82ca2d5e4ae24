import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { lazyChroma, type LazyChroma } from "../src/embedded/chroma.ts";
import type { ChromaHost } from "../src/embedded/embedded.ts";

vi.setConfig({ testTimeout: 120_000 });

// Where the embedded Chroma runs when its host (the embedded database's process) cannot run it:
// a host whose Chroma ends before it answers is not asked again, and Chroma runs in a process of
// its own for the rest of the run (a Chroma that crashes in the host takes the database along).
const dirs: string[] = [];
const chromas: LazyChroma[] = [];
afterAll(async () => {
  for (const chroma of chromas) await chroma.stop();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe("the embedded Chroma's host", () => {
  it("is given up after a Chroma that ended before it answered, once, for a process of its own", async () => {
    const dataDir = mkdtempSync(path.join(tmpdir(), "engram-chroma-host-"));
    dirs.push(dataDir);
    const asked: number[] = [];
    const failing: ChromaHost = async (_dir, port) => {
      asked.push(port);
      return { pid: process.pid, port, gone: Promise.resolve(), output: () => "thread 'main' panicked" };
    };
    const givenUp: string[] = [];
    const chroma = lazyChroma({ dataDir, host: failing, onHostGivenUp: (error) => givenUp.push(error.message) });
    chromas.push(chroma);

    const first = await chroma.get();
    expect(asked).toHaveLength(1);
    expect(givenUp).toEqual([expect.stringContaining("thread 'main' panicked")]);
    expect(first.pid).not.toBe(process.pid);
    expect(readFileSync(`/proc/${first.pid}/cmdline`, "utf8")).toContain("chroma-child");
    const owner = JSON.parse(readFileSync(path.join(dataDir, "chroma.owner.json"), "utf8"));
    expect(owner).toEqual({ pid: first.pid, started: expect.any(Number), port: Number(new URL(first.url).port) });
    expect((await chroma.health()).status).toBe("ok");

    // Killed, it comes back in a process of its own again: the host is not asked.
    process.kill(first.pid!, "SIGKILL");
    await vi.waitUntil(() => !first.alive(), { timeout: 10_000 });
    expect(existsSync(path.join(dataDir, "chroma.owner.json"))).toBe(false);
    const again = await chroma.get();
    expect(again.pid).not.toBe(first.pid);
    expect(asked).toHaveLength(1);
    expect(givenUp).toHaveLength(1);
  });
});
