// Runs Chroma's server for Engram, in one process whose life is tied to Engram's. The server is
// a native binding that blocks the thread it runs on, so it runs in a worker thread while this
// thread watches the parent: when Engram goes away (even by SIGKILL) or asks, the process exits
// and the server with it. No grandchild process exists that could be orphaned.
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import { watchParent } from "./parent-watch.mjs";

const [root, dataDir, port] = process.argv.slice(2);

let stopping = false;
function stop() {
  if (stopping) return;
  stopping = true;
  // The binding has no stop call, and process.exit() would wait forever to join the worker
  // thread blocked in native code: the process ends itself the one way that cannot hang.
  // Chroma's SQLite and its segment files are written to survive exactly that.
  process.kill(process.pid, "SIGKILL");
}
watchParent(stop);

// The same per-platform package the `chroma` command loads.
const platform = { "linux-x64": "linux-x64-gnu", "linux-arm64": "linux-arm64-gnu", "darwin-x64": "darwin-x64", "darwin-arm64": "darwin-arm64" }[`${process.platform}-${process.arch}`];
const binding = createRequire(`${root}/package.json`).resolve(`chromadb-js-bindings-${platform}`);
const server = new Worker(
  `require(${JSON.stringify(binding)}).cli(["chroma", "run", "--path", ${JSON.stringify(dataDir)}, "--host", "127.0.0.1", "--port", ${JSON.stringify(port)}]);`,
  { eval: true },
);
server.on("error", (error) => {
  process.stderr.write(`embedded Chroma: ${error?.message ?? error}\n`);
  stop();
});
server.on("exit", (code) => {
  process.exitCode = code || 1;
  stop();
});
