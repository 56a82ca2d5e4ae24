// Chroma's server (the native binding the `chroma` command of the `chromadb` package loads) on a
// worker thread of the calling process. Plain JS, like the children that call it.
//
// The binding blocks the thread it runs on and has no stop call, so a process hosting it cannot
// end by process.exit(), which would wait forever to join that thread: it ends by SIGKILL.
// Chroma's SQLite and its segment files are written to survive exactly that.
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

const PLATFORMS = { "linux-x64": "linux-x64-gnu", "linux-arm64": "linux-arm64-gnu", "darwin-x64": "darwin-x64", "darwin-arm64": "darwin-arm64" };

/** Starts Chroma on 127.0.0.1:port with its data in dataDir; `root` is Engram's install folder. */
export function startChromaThread(root, dataDir, port) {
  const platform = PLATFORMS[`${process.platform}-${process.arch}`];
  const binding = createRequire(`${root}/package.json`).resolve(`chromadb-js-bindings-${platform}`);
  const args = ["chroma", "run", "--path", dataDir, "--host", "127.0.0.1", "--port", String(port)];
  return new Worker(`require(${JSON.stringify(binding)}).cli(${JSON.stringify(args)});`, { eval: true });
}
