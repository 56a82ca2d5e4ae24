// Runs in a child process: owns the PGlite data folder and serves it over the PostgreSQL wire
// protocol on loopback, so the server's event loop never runs the WASM database.
//
// PGlite is one backend session. Several client connections share it safely only if (a) each
// client's extended-protocol exchange (Parse/Bind/Execute… up to Sync) runs without another
// client's messages in between, and (b) an open transaction belongs to one client until it
// ends. This server batches each client's messages up to Sync / Query and runs batches one at a
// time, pinning the session to the client that holds a transaction.
//
// A pinned session must never wedge the store: it is released when its client errors or
// disconnects (rolled back), and a client that holds a transaction while others wait, sending
// nothing for idleTxMs, is disconnected and rolled back (PostgreSQL's
// idle_in_transaction_session_timeout). If PGlite itself fails (it throws instead of answering
// with an error message, or a batch never finishes), the process exits non-zero (by SIGKILL when
// it runs Chroma, below) so that Engram restarts it on the same port.
import { timingSafeEqual } from "node:crypto";
import net from "node:net";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";
import { START_OPTIONS } from "./pglite-params.mjs";
import { watchParent } from "./parent-watch.mjs";
import { startChromaThread } from "./chroma-thread.mjs";

const [dataDir, maxConnectionsArg = "32", portArg = "0", idleTxMsArg = "15000", stuckMsArg = "120000"] =
  process.argv.slice(2);
const maxConnections = Number(maxConnectionsArg);
// The database's password (the data folder's, given by Engram in the environment): a client
// that does not give it is refused, so another user of the machine cannot use the loopback port.
const PASSWORD = process.env.ENGRAM_STORE_PASSWORD ?? "";
delete process.env.ENGRAM_STORE_PASSWORD;
if (!PASSWORD) {
  process.stderr.write("embedded database: no password given (ENGRAM_STORE_PASSWORD); not serving an open port\n");
  process.exit(1);
}
/** A client has this long to give the password (PostgreSQL's authentication_timeout), then it is cut off. */
const AUTH_TIMEOUT_MS = 10_000;
/**
 * Connections still to give the password, at most. They do not count against maxConnections, so
 * clients that connect and say nothing (another user of the machine, reconnecting) never take the
 * places Engram's own connections need. Past this many, a new one cuts off the oldest if that one
 * has had LOGIN_CHANCE_MS to log in, else the newcomer is refused: connections that arrive
 * together while PGlite is busy (Engram opens up to 11) are all accepted before any has spoken,
 * and must not cut each other off.
 */
const MAX_UNAUTHENTICATED = 64;
const LOGIN_CHANCE_MS = 1_000;
const idleTxMs = Number(idleTxMsArg);
const stuckMs = Number(stuckMsArg);
const BROKEN = 70; // exit code: the database failed, restart me

/** @type {PGlite | undefined} */
let db;
let stopRequested = false;
let stopStarted = false;
// Watch the parent before anything slow: a parent that dies while PGlite opens must not leave us behind.
watchParent(() => void stop());

// This process also runs the embedded Chroma's server when Engram asks: on a thread it costs
// ~32 MB, against ~75 MB as a process of its own (a Node runtime's own pages and heap, counted
// once). It is native code on its own thread: once started, PGlite's work on this one never
// delays it. One at a time: Engram asks { chroma: { root, dir, port } } and is told
// { chromaStarting: port }, { chromaRunning: port } (one runs already, on that port), or
// { chromaFailed: why }; then { chromaExited: port } when it ends. While it runs, this process
// can only end by SIGKILL (chroma-thread.mjs), so every way out goes through exit() below.
/** @type {{ port: number } | null} */
let chroma = null;
const tell = (message) => {
  if (process.connected) process.send(message, () => {});
};
process.on("message", (message) => {
  const request = message?.chroma;
  if (!request) return;
  if (chroma) return tell({ chromaRunning: chroma.port });
  if (stopRequested) return tell({ chromaFailed: "the embedded database is stopping" });
  let thread;
  try {
    thread = startChromaThread(request.root, request.dir, request.port);
  } catch (error) {
    return tell({ chromaFailed: String(error?.message ?? error) });
  }
  const running = { port: request.port };
  chroma = running;
  thread.on("error", (error) => process.stderr.write(`embedded Chroma: ${error?.message ?? error}\n`));
  thread.on("exit", () => {
    if (chroma === running) chroma = null;
    tell({ chromaExited: running.port });
  });
  tell({ chromaStarting: running.port });
});
const exit = (code) => (chroma ? process.kill(process.pid, "SIGKILL") : process.exit(code));
// Whatever else would end this process must not wait on Chroma's thread (it would never end).
for (const event of ["uncaughtException", "unhandledRejection"]) {
  process.on(event, (error) => {
    process.stderr.write(`embedded database: ${error?.stack ?? error}\n`);
    exit(BROKEN);
  });
}
// Engram reads this process's stderr through a pipe: once Engram is gone, a write must not throw.
process.stderr.on("error", () => {});

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;
// Sync, simple Query, Flush and Terminate end a batch: the client waits for an answer after them.
const BATCH_END = new Set(["S", "Q", "H", "X"]);

// A new folder is created in a short-lived process of its own (src/embedded/pglite-init.mjs): what
// creating it leaves in the WASM heap would otherwise stay with this process for good. That process
// unpacks the template made at install, or runs initdb when there is none, on V8's baseline
// compiler only (--liftoff-only): it runs once, and optimising its code cost more memory and time
// than it saved. Its peak RSS, measured: initdb 887 MB with the defaults, 795 with the shared
// buffers, 670 with both (6.8 -> 5.3 s); the template, 288 MB (1.8 s).
// Engram gone (or asking to stop) before the folder is opened: there is nothing to close.
if (stopRequested) process.exit(0);
if (!existsSync(path.join(dataDir, "PG_VERSION"))) {
  const code = await new Promise((resolve, reject) => {
    const args = ["--liftoff-only", fileURLToPath(new URL("./pglite-init.mjs", import.meta.url)), dataDir];
    const child = spawn(process.execPath, args, { stdio: ["ignore", "ignore", "inherit"] });
    child.once("error", reject);
    child.once("exit", (exitCode) => resolve(exitCode));
  });
  if (code !== 0 || !existsSync(path.join(dataDir, "PG_VERSION"))) {
    // pglite-init.mjs has said why, on the same stderr.
    process.stderr.write(`embedded database: creating ${dataDir} failed (exit code ${code})\n`);
    process.exit(1);
  }
}
if (stopRequested) process.exit(0);
db = await PGlite.create(dataDir, START_OPTIONS);

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
    /** The startup message, held until the client has given the password. */
    this.startup = null;
    this.pending = [];
    this.closed = false;
    this.refused = false;
    this.lastActive = Date.now();
    this.connectedAt = Date.now();
    // One that connects and never gives the password would hold a connection's place for ever.
    this.authTimer = setTimeout(() => {
      if (this.startup !== null || !this.started) socket.destroy();
    }, AUTH_TIMEOUT_MS);
    this.authTimer.unref();
  }

  receive(data) {
    if (this.refused) return;
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
        const startup = Buffer.from(this.buffer.subarray(0, length));
        this.buffer = this.buffer.subarray(length);
        this.started = true;
        // PostgreSQL's password exchange, before PGlite sees the startup (which it answers with
        // AuthenticationOk): AuthenticationCleartextPassword, then the client's PasswordMessage.
        this.startup = startup;
        this.socket.write(Buffer.from([0x52, 0, 0, 0, 8, 0, 0, 0, 3]));
        continue;
      }
      if (this.startup) {
        if (this.buffer.length < 5) return;
        const length = this.buffer.readInt32BE(1) + 1;
        if (this.buffer.length < length) return;
        const message = this.buffer.subarray(0, length);
        this.buffer = this.buffer.subarray(length);
        if (message[0] !== 0x70 || !passwordMatches(message.subarray(5, length - 1))) {
          // One try a connection: what it sends after is not read.
          this.refused = true;
          return refuse(this.socket);
        }
        const startup = this.startup;
        this.startup = null;
        clearTimeout(this.authTimer);
        unauthenticated.delete(this);
        if (connections.size >= maxConnections) {
          this.socket.destroy();
          return;
        }
        connections.add(this);
        this.enqueue(startup, true);
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
        this.enqueue(Buffer.concat(this.pending), type === "S" || type === "Q");
        this.pending = [];
      }
    }
  }

  /** expectsReply: the batch ends with Sync or Query (or is the startup), so PostgreSQL must answer it. */
  enqueue(batch, expectsReply = false) {
    queue.push({ conn: this, batch: Buffer.from(batch), expectsReply });
    void drain();
  }
}

/** Whether a PasswordMessage's text is the database's password (compared in constant time). */
function passwordMatches(given) {
  const wanted = Buffer.from(PASSWORD);
  return given.length === wanted.length && timingSafeEqual(given, wanted);
}

/** An ErrorResponse as PostgreSQL sends it for a wrong password (28P01), then the end. */
function refuse(socket) {
  const fields = ["SFATAL", "VFATAL", "C28P01", 'Mpassword authentication failed for user "postgres"'].map((f) => Buffer.from(`${f}\0`));
  const body = Buffer.concat([...fields, Buffer.from([0])]);
  const header = Buffer.alloc(5);
  header.write("E");
  header.writeInt32BE(body.length + 4, 1);
  socket.end(Buffer.concat([header, body]), () => socket.destroy());
}

async function drain() {
  if (running) return;
  running = true;
  try {
    for (;;) {
      const index = owner ? queue.findIndex((item) => item.conn === owner) : 0;
      if (index < 0 || queue.length === 0) break;
      const [{ conn, batch, expectsReply }] = queue.splice(index, 1);
      if (conn.closed) continue;
      conn.lastActive = Date.now();
      batchStarted = Date.now();
      const answer = lastMessageType();
      try {
        await db.runExclusive(() =>
          db.execProtocolRawStream(new Uint8Array(batch), {
            onRawData: (chunk) => {
              answer.feed(chunk);
              if (!conn.closed) conn.socket.write(Buffer.from(chunk));
            },
          }),
        );
        // A complete answer ends with ReadyForQuery (or a COPY handshake). Seen on a full disk:
        // PGlite PANICs on a WAL write, answers the error without ReadyForQuery, and the client
        // would wait forever. PostgreSQL restarts after a PANIC; so do we.
        if (expectsReply && !["Z", "G", "H", "W"].includes(answer.type())) {
          conn.socket.destroy();
          fail("the database failed mid-answer (a PANIC, e.g. on a full disk)");
        }
      } catch (error) {
        // SQL errors reach the client as ErrorResponse messages; a throw means PGlite itself failed.
        process.stderr.write(`embedded database: ${error?.message ?? error}\n`);
        conn.socket.destroy();
        if (!(await stillWorks())) fail("the database stopped answering after an internal error");
      } finally {
        batchStarted = 0;
      }
      conn.lastActive = Date.now();
      owner = inTransaction() ? conn : null;
      if (owner?.closed) await rollback();
    }
  } finally {
    running = false;
  }
}

/** Tracks the type of the last complete message in a stream of backend messages. */
function lastMessageType() {
  let header = Buffer.alloc(0);
  let skip = 0;
  let last = "";
  return {
    feed(chunk) {
      let data = Buffer.from(chunk);
      while (data.length) {
        if (skip > 0) {
          const n = Math.min(skip, data.length);
          skip -= n;
          data = data.subarray(n);
          continue;
        }
        const need = 5 - header.length;
        header = Buffer.concat([header, data.subarray(0, need)]);
        data = data.subarray(need);
        if (header.length === 5) {
          last = String.fromCharCode(header[0]);
          skip = header.readInt32BE(1) - 4;
          header = Buffer.alloc(0);
        }
      }
    },
    type: () => (skip === 0 && header.length === 0 ? last : ""),
  };
}

function inTransaction() {
  try {
    return db.isInTransaction();
  } catch {
    return false;
  }
}

async function rollback() {
  if (inTransaction()) {
    const done = await Promise.race([
      db.exec("ROLLBACK").then(() => true, () => true),
      new Promise((resolve) => setTimeout(() => resolve(false), 5_000).unref()),
    ]);
    if (!done) fail("a rollback did not finish within 5 s");
  }
  owner = null;
}

/** Whether PGlite still answers a trivial query, within 5 s. */
async function stillWorks() {
  try {
    await Promise.race([
      db.query("SELECT 1"),
      new Promise((_, reject) => setTimeout(() => reject(new Error("timeout")), 5_000).unref()),
    ]);
    return true;
  } catch {
    return false;
  }
}

function fail(reason) {
  process.stderr.write(`embedded database: ${reason}; exiting so Engram restarts it\n`);
  exit(BROKEN);
}

let batchStarted = 0;
// The watchdog: an owner idle in its transaction while others wait is cut off; a batch that
// never ends means PGlite is stuck.
setInterval(() => {
  const now = Date.now();
  if (batchStarted && now - batchStarted > stuckMs) fail(`a statement has run for ${Math.round((now - batchStarted) / 1000)} s`);
  if (owner && !running && !owner.closed && now - owner.lastActive > idleTxMs && queue.some((item) => item.conn !== owner)) {
    process.stderr.write(
      `embedded database: a client held a transaction idle for ${Math.round((now - owner.lastActive) / 1000)} s while others waited; it was disconnected and its transaction rolled back\n`,
    );
    const stuck = owner;
    stuck.socket.destroy();
    void release(stuck);
  }
}, Math.min(1_000, Math.max(50, idleTxMs / 4))).unref();

async function release(conn) {
  if (conn.closed) return;
  conn.closed = true;
  connections.delete(conn);
  unauthenticated.delete(conn);
  for (let i = queue.length - 1; i >= 0; i--) if (queue[i].conn === conn) queue.splice(i, 1);
  if (owner === conn) {
    // The client left mid-transaction: roll it back so the others can go on.
    while (running) await new Promise((resolve) => setTimeout(resolve, 5));
    if (owner === conn) await rollback();
  }
  void drain();
}

/** Logged-in connections (at most maxConnections), and those still to give the password, oldest first. */
const connections = new Set();
const unauthenticated = new Set();
const server = net.createServer((socket) => {
  if (unauthenticated.size >= MAX_UNAUTHENTICATED) {
    const [oldest] = unauthenticated;
    if (Date.now() - oldest.connectedAt < LOGIN_CHANCE_MS) {
      socket.destroy();
      return;
    }
    unauthenticated.delete(oldest);
    oldest.socket.destroy();
  }
  socket.setNoDelay(true);
  const conn = new Connection(socket);
  unauthenticated.add(conn);
  socket.on("data", (data) => conn.receive(data));
  socket.on("close", () => void release(conn));
  socket.on("error", () => void release(conn));
});
await new Promise((resolve, reject) => {
  server.once("error", reject);
  server.listen(Number(portArg), "127.0.0.1", resolve);
});
const { port } = server.address();

async function stop() {
  stopRequested = true;
  if (!db || stopStarted) return; // still opening: stop() runs again right after PGlite.create
  stopStarted = true;
  // Never wait on a wedged database for long: a stop always ends within 5 s.
  setTimeout(() => exit(0), 5_000).unref();
  try {
    server.close();
    for (const conn of [...connections, ...unauthenticated]) conn.socket.destroy();
    while (running) await new Promise((resolve) => setTimeout(resolve, 5));
    await db.close();
  } finally {
    exit(0);
  }
}

if (stopRequested) await stop();
tell({ ready: true, port });
