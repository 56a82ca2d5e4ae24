// Runs `chroma run` for Engram and ties its life to Engram's: when the parent process goes
// away (IPC disconnect, even on SIGKILL), Chroma is stopped too. The Chroma server itself is
// a native binding that owns its thread, so it runs one process further down.
import { spawn } from "node:child_process";

const [bin, dataDir, port] = process.argv.slice(2);
const chroma = spawn(bin, ["run", "--path", dataDir, "--host", "127.0.0.1", "--port", port], {
  stdio: ["ignore", "pipe", "pipe"],
});
let output = "";
const keep = (chunk) => {
  output = (output + chunk.toString()).slice(-4_000);
};
chroma.stdout.on("data", keep);
chroma.stderr.on("data", keep);
chroma.on("exit", (code, signal) => {
  if (process.connected) process.send({ exited: { code, signal, output } });
  process.exit(0);
});

function stop() {
  if (chroma.exitCode !== null) process.exit(0);
  chroma.kill("SIGTERM");
  setTimeout(() => chroma.kill("SIGKILL"), 5_000).unref();
}

process.on("message", (message) => {
  if (message === "stop") stop();
});
process.on("disconnect", stop);
process.on("SIGTERM", stop);
process.on("SIGINT", () => {}); // a terminal's Ctrl-C reaches the parent, which stops us in order
