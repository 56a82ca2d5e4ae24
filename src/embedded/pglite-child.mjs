// Runs in a child process: owns the PGlite data folder and serves it over the PostgreSQL wire
// protocol on loopback, so the server's event loop never runs the WASM database.
//
// PGlite is one backend session. Several client connections share it safely only if (a) each
// client's extended-protocol exchange (Parse/Bind/Execute… up to Sync) runs without another
// client's messages in between, and (b) an open transaction belongs to one client until it
// ends. This server batches each client's messages up to Sync / Query and runs batches one at a
// time, pinning the session to the client that holds a transaction.
import net from "node:net";
import { PGlite } from "@electric-sql/pglite";

const [dataDir, maxConnectionsArg = "32"] = process.argv.slice(2);
const maxConnections = Number(maxConnectionsArg);

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;
// Sync, simple Query, Flush and Terminate end a batch: the client waits for an answer after them.
const BATCH_END = new Set(["S", "Q", "H", "X"]);

const db = await PGlite.create(dataDir);

/** @type {{ conn: Connection, batch: Buffer }[]} */
const queue = [];
/** @type {Connection | null} the client whose transaction is open */
let owner = null;
let running = false;

class Connection {
  constructor(socket) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.started = false;
    this.pending = [];
    this.closed = false;
  }

  receive(data) {
    this.buffer = Buffer.concat([this.buffer, data]);
    for (;;) {
      if (!this.started) {
        if (this.buffer.length < 8) return;
        const length = this.buffer.readInt32BE(0);
        const code = this.buffer.readInt32BE(4);
        if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
          this.buffer = this.buffer.subarray(8);
          this.socket.write("N");
          continue;
        }
        if (code === CANCEL_REQUEST) {
          this.socket.destroy();
          return;
        }
        if (this.buffer.length < length) return;
        this.started = true;
        this.enqueue(this.buffer.subarray(0, length));
        this.buffer = this.buffer.subarray(length);
        continue;
      }
      if (this.buffer.length < 5) return;
      const length = this.buffer.readInt32BE(1) + 1;
      if (this.buffer.length < length) return;
      const type = String.fromCharCode(this.buffer[0]);
      const message = this.buffer.subarray(0, length);
      this.buffer = this.buffer.subarray(length);
      if (type === "X") {
        this.socket.end();
        return;
      }
      this.pending.push(message);
      if (BATCH_END.has(type)) {
        this.enqueue(Buffer.concat(this.pending));
        this.pending = [];
      }
    }
  }

  enqueue(batch) {
    queue.push({ conn: this, batch: Buffer.from(batch) });
    void drain();
  }
}

async function drain() {
  if (running) return;
  running = true;
  try {
    for (;;) {
      const index = owner ? queue.findIndex((item) => item.conn === owner) : 0;
      if (index < 0 || queue.length === 0) break;
      const [{ conn, batch }] = queue.splice(index, 1);
      if (conn.closed) continue;
      try {
        await db.runExclusive(() =>
          db.execProtocolRawStream(new Uint8Array(batch), {
            onRawData: (chunk) => {
              if (!conn.closed) conn.socket.write(Buffer.from(chunk));
            },
          }),
        );
      } catch (error) {
        process.stderr.write(`embedded database: ${error?.message ?? error}\n`);
        conn.socket.destroy();
      }
      owner = db.isInTransaction() ? conn : null;
    }
  } finally {
    running = false;
  }
}

async function release(conn) {
  if (conn.closed) return;
  conn.closed = true;
  connections.delete(conn);
  for (let i = queue.length - 1; i >= 0; i--) if (queue[i].conn === conn) queue.splice(i, 1);
  if (owner === conn) {
    // The client left mid-transaction: roll it back so the others can go on.
    while (running) await new Promise((resolve) => setTimeout(resolve, 5));
    if (db.isInTransaction()) await db.exec("ROLLBACK").catch(() => {});
    owner = null;
  }
  void drain();
}

const connections = new Set();
const server = net.createServer((socket) => {
  if (connections.size >= maxConnections) {
    socket.destroy();
    return;
  }
  socket.setNoDelay(true);
  const conn = new Connection(socket);
  connections.add(conn);
  socket.on("data", (data) => conn.receive(data));
  socket.on("close", () => void release(conn));
  socket.on("error", () => void release(conn));
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const { port } = server.address();

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    server.close();
    for (const conn of connections) conn.socket.destroy();
    while (running) await new Promise((resolve) => setTimeout(resolve, 5));
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
