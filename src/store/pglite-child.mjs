// Runs in a child process: owns the PGlite data folder and serves it over the PostgreSQL wire
// protocol on loopback, so the server's event loop never runs the WASM database.
import { PGlite } from "@electric-sql/pglite";
import { PGLiteSocketServer } from "@electric-sql/pglite-socket";

const [dataDir, maxConnections = "16"] = process.argv.slice(2);

const db = await PGlite.create(dataDir);
const server = new PGLiteSocketServer({
  db,
  host: "127.0.0.1",
  port: 0,
  maxConnections: Number(maxConnections),
});
await server.start();
const port = Number(server.getServerConn().split(":").pop());

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    await server.stop();
    await db.close();
  } finally {
    process.exit(0);
  }
}

process.on("message", (message) => {
  if (message === "stop") void stop();
});
// If the owner dies, close the database cleanly rather than leave it open forever.
process.on("disconnect", () => void stop());
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());

process.send?.({ ready: true, port });
