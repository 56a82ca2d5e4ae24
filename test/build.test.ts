import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { asciiOnly } from "../scripts/ascii-only.mjs";
import { ensureCompiled, ROOT } from "./helpers/server-process.ts";

const NON_ASCII = /[^\x00-\x7f]/;

describe("the compiled server", () => {
  it("is ASCII only, so Node keeps each module's source at one byte a character", () => {
    ensureCompiled();
    const dist = path.join(ROOT, "dist");
    const files = readdirSync(dist, { recursive: true }).map(String).filter((file) => file.endsWith(".js"));
    expect(files.length).toBeGreaterThan(2);
    expect(files.filter((file) => NON_ASCII.test(readFileSync(path.join(dist, file), "utf8")))).toEqual([]);
  });

  it("imports Prisma's compiler as text read when decoded, not as a module it would hold", () => {
    ensureCompiled();
    const dist = path.join(ROOT, "dist");
    const sources = readdirSync(dist, { recursive: true }).map(String).filter((file) => file.endsWith(".js")).map((file) => readFileSync(path.join(dist, file), "utf8"));
    expect(sources.filter((source) => /import\(["']@prisma\/client\/runtime\/query_compiler_bg\.postgresql\.wasm-base64/.test(source))).toEqual([]);
    expect(sources.filter((source) => source.includes("[Symbol.toPrimitive]()") && source.includes("query_compiler_bg.postgresql.wasm-base64.mjs"))).toHaveLength(1);
  });

  it("loses nothing a program can see in making a file ASCII", async () => {
    const file = path.join(mkdtempSync(path.join(tmpdir(), "engram-ascii-")), "m.mjs");
    writeFileSync(
      file,
      [
        "// a dash – and a wave 👋",
        "/* “quoted” */ export const dashes = /[^\\s:–—-]+/g;",
        "export const wave = /👋+/u;",
        "export const plain = /(to|–|until)/i;",
        "export const text = `a “template” stays`;",
        // An escaped non-ASCII character (an identity escape, without u) and an escaped backslash before one.
        "export const escaped = /a\\–b/; export const inClass = /[\\–x]/; export const backslash = /\\\\–/;",
        // A slash after await starts a regular expression: only a parse knows.
        'export const awaited = await /–/.test("\\u2013");',
      ].join("\n"),
    );
    const kept = asciiOnly(file);
    const out = readFileSync(file, "utf8");
    expect(kept).toEqual({ line: 5 });
    expect(NON_ASCII.test(out.split("\n").filter((_, i) => i !== 4).join("\n"))).toBe(false);
    const mod = await import(file);
    expect("a–b—c".match(mod.dashes)).toEqual(["a", "b", "c"]);
    expect(mod.wave.test("👋👋")).toBe(true);
    expect(mod.wave.exec("x👋👋")![0]).toBe("👋👋");
    expect(mod.plain.test("–")).toBe(true);
    expect(mod.text).toBe("a “template” stays");
    expect(mod.awaited).toBe(true);
    expect([mod.escaped.test("a–b"), mod.inClass.test("–"), mod.inClass.test("u"), mod.inClass.test("\\")]).toEqual([true, true, false, false]);
    expect([mod.backslash.test("\\–"), mod.backslash.test("–")]).toEqual([true, false]);
  });
});
