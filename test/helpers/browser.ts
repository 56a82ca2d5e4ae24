import { existsSync, readdirSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type Page } from "playwright-core";

// Debian's chromium, driven by playwright-core (no browser download anywhere).
export const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const DIST = path.join(ROOT, "web/dist/index.html");
const CHROMIUM = process.env.ENGRAM_TEST_CHROMIUM ?? "/usr/bin/chromium";

export const DESKTOP = { width: 1440, height: 900 };
export const PHONE = { width: 390, height: 844 };

const newestIn = (dir: string): number =>
  readdirSync(dir, { withFileTypes: true }).reduce((newest, entry) => {
    const full = path.join(dir, entry.name);
    return Math.max(newest, entry.isDirectory() ? newestIn(full) : statSync(full).mtimeMs);
  }, 0);

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
