import { existsSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { expect } from "vitest";
import { newestIn, ROOT } from "../../src/paths.ts";

// Debian's chromium, driven by playwright-core (no browser download anywhere).
export { ROOT };
const DIST = path.join(ROOT, "web/dist/index.html");
const CHROMIUM = process.env.ENGRAM_TEST_CHROMIUM ?? "/usr/bin/chromium";

export const DESKTOP = { width: 1440, height: 900 };
export const PHONE = { width: 390, height: 844 };

/** Builds web/dist when it is missing or older than the page's sources or the typed documents. */
export async function ensureInspectorBuilt() {
  const sources = Math.max(newestIn(path.join(ROOT, "web/src")), newestIn(path.join(ROOT, "src/gql")));
  if (existsSync(DIST) && statSync(DIST).mtimeMs >= sources) return;
  const { build } = await import("vite");
  await build({ configFile: path.join(ROOT, "web/vite.config.ts"), logLevel: "warn" });
}

export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Playwright gives each launch a new, empty profile; the rest keeps chromium off the network.
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

/** How far the page is wider than its window (0 when nothing scrolls sideways). */
export const horizontalOverflow = (page: Page) =>
  page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);

const AXE_SOURCE = readFileSync(path.join(ROOT, "node_modules/axe-core/axe.min.js"), "utf8");

export type AxeViolation = { id: string; impact: string | null; help: string; targets: string[] };

/** axe-core's WCAG checks on the page as it is now (evaluated through the devtools protocol, so the page's CSP allows it). */
export async function axeViolations(page: Page): Promise<AxeViolation[]> {
  if (!(await page.evaluate(() => "axe" in window))) await page.evaluate(`${AXE_SOURCE}\n;void 0`);
  return page.evaluate(async () => {
    const axe = (window as unknown as { axe: { run(context: Document, options: object): Promise<{ violations: any[] }> } }).axe;
    const { violations } = await axe.run(document, { resultTypes: ["violations"] });
    return violations.map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      targets: v.nodes.slice(0, 3).map((n: { target: string[] }) => n.target.join(" ")),
    }));
  });
}

/** expect.poll with room for a shared machine: a page may take seconds to show what it loaded. */
export const poll = <T>(read: () => Promise<T> | T) => expect.poll(read, { timeout: 20_000 });

/** Signs the page in to the inspector at `url` with a key, from a clean storage. */
export async function signIn(page: Page, url: string, key: string) {
  await page.goto(`${url}/inspector/`);
  await page.evaluate(() => (localStorage.clear(), sessionStorage.clear()));
  await page.reload();
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("navigation", { name: "Sections" }).waitFor();
}
