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
 * True when this code runs from dist/ and a source file is newer than the build (edited sources
 * that `npm start` would not run until `npm run build`).
 */
export function staleBuild(): boolean {
  const self = fileURLToPath(import.meta.url);
  if (!self.startsWith(fromRoot("dist") + path.sep)) return false;
  const built = statSync(self).mtimeMs;
  const newer = (dir: string): boolean =>
    readdirSync(dir, { withFileTypes: true }).some((entry) => {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) return entry.name !== "generated" && newer(full);
      return /\.(ts|mjs)$/.test(entry.name) && statSync(full).mtimeMs > built;
    });
  try {
    return newer(fromRoot("src")) || newer(fromRoot("jobs")) || newer(fromRoot("bin"));
  } catch {
    return false;
  }
}
