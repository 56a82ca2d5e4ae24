import { existsSync, readdirSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The package's folder, found from this module upwards: the same answer whether the code runs
 * from src/ (tests, tsx) or from the bundle in dist/.
 */
function packageRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  while (!existsSync(path.join(dir, "package.json"))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error("Engram's package.json was not found above its code.");
    dir = up;
  }
  return dir;
}

export const ROOT = packageRoot();

/** A path inside the package: `fromRoot("prisma", "migrations")`. */
export const fromRoot = (...parts: string[]) => path.join(ROOT, ...parts);

/**
 * The newest modification time of the files under `dir`, optionally only those ending in `ext`,
 * leaving out folders named `skip`.
 */
export function newestIn(dir: string, options: { ext?: string; skip?: string } = {}): number {
  return readdirSync(dir, { withFileTypes: true }).reduce((newest, entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return entry.name === options.skip ? newest : Math.max(newest, newestIn(full, options));
    return !options.ext || entry.name.endsWith(options.ext) ? Math.max(newest, statSync(full).mtimeMs) : newest;
  }, 0);
}

/**
 * The newest modification time of the TypeScript the build compiles into dist/ (src, jobs and
 * bin, less src/generated: Prisma's client and Pothos' types, which `npm ci` generates just
 * before it builds). The .mjs files are run from the sources as they are, so an edit to one needs
 * no build.
 */
export function newestCompiledSource(): number {
  return Math.max(...["src", "jobs", "bin"].map((dir) => newestIn(fromRoot(dir), { ext: ".ts", skip: "generated" })));
}

/**
 * True when this code runs from dist/ and a source file is newer than the build (edited sources
 * that `npm start` would not run until `npm run build`).
 */
export function staleBuild(): boolean {
  const self = fileURLToPath(import.meta.url);
  if (!self.startsWith(fromRoot("dist") + path.sep)) return false;
  try {
    return newestCompiledSource() > statSync(self).mtimeMs;
  } catch {
    return false;
  }
}
