// Runs Chroma's server for Engram, in one process whose life is tied to Engram's, when no
// embedded database process hosts it (the PostgreSQL store, or a Chroma started on its own).
// The server blocks the thread it runs on, so it runs on a worker thread while this thread
// watches the parent: when Engram goes away (even by SIGKILL) or asks, the process exits and
// the server with it. No grandchild process exists that could be orphaned.
import { watchParent } from "./parent-watch.mjs";
import { endProcess, startChromaThread } from "./chroma-thread.mjs";

const [root, dataDir, port] = process.argv.slice(2);

let stopping = false;
function stop() {
  if (stopping) return;
  stopping = true;
  endProcess(0, true);
}
watchParent(stop);

const server = startChromaThread(root, dataDir, port);
server.on("error", (error) => {
  process.stderr.write(`embedded Chroma: ${error?.message ?? error}\n`);
  stop();
});
server.on("exit", (code) => {
  process.exitCode = code || 1;
  stop();
});
