import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { attachOrStartEmbeddedChroma } from "../src/embedded/chroma.ts";
import type { ChromaHost } from "../src/embedded/embedded.ts";
import { ROOT } from "../src/paths.ts";

vi.setConfig({ testTimeout: 120_000 });

// One embedded Chroma per data folder: chroma.owner.json is claimed before a server starts, so two
// processes starting Chroma at once (a CLI command and the server) cannot both start one.
const dirs: string[] = [];
const children: ChildProcess[] = [];
const servers: http.Server[] = [];
afterAll(() => {
  for (const child of children) child.kill("SIGKILL");
  for (const server of servers) server.close();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir() {
  const dir = mkdtempSync(path.join(tmpdir(), "engram-chroma-owner-"));
  dirs.push(dir);
  return dir;
}

describe("the embedded Chroma's owner file", () => {
  it("is won by exactly one of several processes claiming it at once over a dead owner's record", async () => {
    const dir = tempDir();
    const file = path.join(dir, "chroma.owner.json");
    const dead = spawnSync(process.execPath, ["-e", ""]).pid;
    writeFileSync(file, JSON.stringify({ pid: dead, port: 1 }));
    const go = path.join(dir, "go");
    const script = path.join(dir, "claim.mts");
    // Each waits for the same instant, claims, and holds what it won until the test ends.
    writeFileSync(
      script,
      `import { existsSync } from "node:fs";
import { claimOwnerFile, ownerRunning } from ${JSON.stringify(path.join(ROOT, "src", "embedded", "owner.ts"))};
const file = ${JSON.stringify(file)};
console.log("ready");
while (!existsSync(${JSON.stringify(go)})) await new Promise((resolve) => setTimeout(resolve, 1));
const holder = claimOwnerFile(file, (owner) => ownerRunning(file, owner));
console.log(holder ? "lost" : "won");
setTimeout(() => {}, 120_000);
`,
    );
    const outputs = Array.from({ length: 6 }, () => {
      const child = spawn(process.execPath, ["--import", "tsx", script], { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
      children.push(child);
      const output = { text: "" };
      child.stdout!.on("data", (data) => (output.text += data));
      return output;
    });
    await vi.waitUntil(() => outputs.every((output) => output.text.includes("ready")), { timeout: 90_000, interval: 100 });
    writeFileSync(go, "");
    await vi.waitUntil(() => outputs.every((output) => /won|lost/.test(output.text)), { timeout: 30_000, interval: 50 });
    const won = outputs.filter((output) => output.text.includes("won"));
    expect(won).toHaveLength(1);
    const winner = children[outputs.indexOf(won[0])].pid;
    expect(JSON.parse(readFileSync(file, "utf8"))).toMatchObject({ pid: winner, port: 0 });
  });

  it("starts one Chroma when two callers in one process start it at once: the second reuses the first's", async () => {
    const dir = tempDir();
    // Stands in for the process that serves Chroma (the database's), and for its seconds-long start.
    const serving = spawn("sleep", ["120"], { stdio: "ignore" });
    children.push(serving);
    const asked: number[] = [];
    const host: ChromaHost = async (_chromaDir, port) => {
      asked.push(port);
      const server = http.createServer((_request, response) => response.end("{}"));
      servers.push(server);
      setTimeout(() => server.listen(port, "127.0.0.1"), 1_000);
      return { pid: serving.pid!, port, gone: new Promise(() => {}), output: () => "" };
    };
    const [first, second] = await Promise.all([attachOrStartEmbeddedChroma(dir, host), attachOrStartEmbeddedChroma(dir, host)]);
    expect(asked).toHaveLength(1);
    expect(second.url).toBe(first.url);
    expect(JSON.parse(readFileSync(path.join(dir, "chroma.owner.json"), "utf8"))).toMatchObject({ pid: serving.pid, port: asked[0] });
    expect(existsSync(path.join(dir, `chroma.owner.json.${process.pid}.new`))).toBe(false);
  });
});
