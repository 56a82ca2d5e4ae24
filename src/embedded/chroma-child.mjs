// Runs Chroma's server for Engram, in one process whose life is tied to Engram's, when no
// embedded database process runs it (the PostgreSQL store, a CLI command attached to a running
// server, or after a Chroma failed to start there). The server blocks the thread it runs on, so
// it runs on a worker thread while this thread watches the parent: when Engram goes away (even
// by SIGKILL) or asks, the process exits and the server with it. No grandchild process exists
// that could be orphaned.
import { watchParent } from "./parent-watch.mjs";
import { startChromaThread } from "./chroma-thread.mjs";

const [root, dataDir, port] = process.argv.slice(2);

/** Ends this process: by SIGKILL, the one way that cannot wait on Chroma's thread (chroma-thread.mjs). */
function stop() {
  process.kill(process.pid, "SIGKILL");
}
watchParent(stop);
for (const event of ["uncaughtException", "unhandledRejection"]) {
  process.on(event, (error) => {
    process.stderr.write(`embedded Chroma: ${error?.stack ?? error}\n`);
    stop();
  });
}

const server = startChromaThread(root, dataDir, port);
server.on("error", (error) => {
  process.stderr.write(`embedded Chroma: ${error?.message ?? error}\n`);
  stop();
});
server.on("exit", stop);
