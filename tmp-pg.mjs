import { PGlite } from "@electric-sql/pglite";
import fs from "node:fs";
const [mode, dir] = process.argv.slice(2);
const params = [...PGlite.defaultStartParams, "-c", "shared_buffers=32MB"];
const t = performance.now();
if (mode === "init") {
  const db = await PGlite.create(dir, { startParams: params });
  const tar = await db.dumpDataDir("gzip");
  fs.writeFileSync("/tmp/enc/pgdata.tar.gz", Buffer.from(await tar.arrayBuffer()));
  await db.close();
} else {
  const blob = new Blob([fs.readFileSync("/tmp/enc/pgdata.tar.gz")]);
  const db = await PGlite.create(dir, { startParams: params, loadDataDir: blob });
  console.log((await db.query("select count(*) from pg_class")).rows);
  await db.close();
}
console.log(mode, (performance.now() - t).toFixed(0), "ms");
