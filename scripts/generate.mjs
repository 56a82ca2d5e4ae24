// Runs `prisma generate` offline. The Pothos generator looks for a query-engine library it does
// not use; pointing PRISMA_QUERY_ENGINE_LIBRARY at any existing file stops it downloading one.
import { spawnSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const bin = path.join(root, "node_modules", ".bin");
const result = spawnSync("prisma", ["generate", ...process.argv.slice(2)], {
  cwd: root,
  stdio: "inherit",
  env: {
    ...process.env,
    PATH: `${bin}${path.delimiter}${process.env.PATH}`,
    PRISMA_QUERY_ENGINE_LIBRARY: path.join(root, "package.json"),
    PRISMA_HIDE_UPDATE_MESSAGE: "1",
  },
});
process.exit(result.status ?? 1);
