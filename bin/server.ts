// The server process's entry point (built to dist/main.js): the one place that composes src/
// with jobs/, by handing the job worker's start to the runner.
import { startWorker } from "../jobs/worker.ts";
import { runServer } from "../src/server.ts";

await runServer({ startWorker });
