import { buildApp, type App } from "./app.ts";
import { DataFolderError, StoreBusyError } from "./embedded/embedded.ts";
import { EnvError, ignoredNames, modelsConfigured, readEnv } from "./env.ts";
import { createLogger, type Logger } from "./log.ts";
import { bootstrapFirstTenant } from "./auth.ts";
import { staleBuild } from "./paths.ts";
import type { Worker } from "./queue.ts";
import { openServices, type Services } from "./services.ts";
import { TimedOut, withTimeout } from "./timeout.ts";

/** Starts the job worker on the open services; bin/server.ts supplies jobs/worker.ts's (src/ never imports jobs/). */
export type StartWorker = (services: Services) => Promise<Worker>;

/** Shutdown never takes longer than this: past it, the process exits and its children follow. */
const SHUTDOWN_DEADLINE_MS = 9_000;
/**
 * Requests in flight (up to 3 s, HTTP_DRAIN_MS) and then running jobs share this much of the
 * shutdown (a job still running is retried later, and gets at least 1 s); the store's close has the rest.
 */
const API_AND_WORKER_GRACE_MS = 4_000;

// What opening a PostgreSQL store fails with when DATABASE_URL is wrong or names a server that is
// away: its network errors, and PostgreSQL's own for a missing database, user or password.
const STORE_UNREACHABLE = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "EHOSTUNREACH", "ECONNRESET", "3D000", "28P01", "28000"]);
// And what listening fails with when HOST names no address of this machine.
const CANNOT_LISTEN = new Set(["EADDRNOTAVAIL", "ENOTFOUND", "EAI_AGAIN", "EACCES"]);

/** DATABASE_URL as it may be shown: without its password. */
function shownUrl(url: string): string {
  try {
    const shown = new URL(url);
    if (shown.password) shown.password = "***";
    if (shown.searchParams.has("password")) shown.searchParams.set("password", "***");
    return shown.toString();
  } catch {
    return "(not a URL)";
  }
}

/**
 * A one-line reason for the failures a user can fix; anything else keeps its stack. `step`:
 * whether the failure came while opening the store or while listening.
 */
function startFailure(error: unknown, env?: { HOST: string; PORT: number; DATABASE_URL?: string }, step?: "store" | "listen"): string {
  if (error instanceof EnvError || error instanceof StoreBusyError || error instanceof DataFolderError) return error.message;
  const code = String((error as NodeJS.ErrnoException)?.code ?? "");
  const message = (error as Error)?.message ?? String(error);
  if (code === "EADDRINUSE" && env) {
    return `Port ${env.PORT} on ${env.HOST} is already in use: stop what listens there, or set PORT to another port.`;
  }
  if (step === "listen" && env && CANNOT_LISTEN.has(code)) {
    return `Cannot listen on ${env.HOST}:${env.PORT} (${code}): set HOST to an address of this machine (127.0.0.1, 0.0.0.0 for every interface) and PORT to a free port.`;
  }
  if (step === "store" && env?.DATABASE_URL && (STORE_UNREACHABLE.has(code) || /PostgreSQL user name|Invalid URL/.test(message))) {
    return `Cannot open the database DATABASE_URL names (${shownUrl(env.DATABASE_URL)}): ${message}. Check DATABASE_URL, and that the server is up.`;
  }
  return `Engram failed to start: ${(error as Error)?.stack ?? error}`;
}

/** Set once shutdown begins; from then on it alone ends the process. */
let stopping: Promise<void> | undefined;

async function serve(startWorker: StartWorker) {
  let env: ReturnType<typeof readEnv>;
  try {
    env = readEnv();
  } catch (error) {
    process.stderr.write(`${startFailure(error)}\n`);
    process.exit(1);
  }
  const log = createLogger(env.ENGRAM_LOG_LEVEL);
  for (const warning of ignoredNames()) log.warn(warning);
  if (staleBuild()) log.warn("dist/ is older than the sources: run `npm run build` to run your changes");

  // What start-up has opened so far; the worker is its promise, so a signal while it starts waits for it.
  const open: { services?: Services; worker?: Promise<Worker | undefined>; app?: App; bootstrap?: Promise<void> } = {};
  // Stops whatever is open, in order, from any point of start-up on.
  const shutdown = (reason: string, code = 0, fields?: object) => {
    stopping ??= (async () => {
      const signalledAt = Date.now();
      if (code) log.error("shutting down", { reason, ...fields });
      else log.info("shutting down", { reason });
      setTimeout(() => {
        log.error(`shutdown took over ${SHUTDOWN_DEADLINE_MS / 1000} s; exiting now`);
        open.services?.store.kill?.();
        process.exit(code || 1);
      }, SHUTDOWN_DEADLINE_MS).unref();
      try {
        const apiStopping = Date.now();
        if (open.app) await open.app.stop().then(() => log.info("API stopped"));
        const workerGraceMs = Math.max(API_AND_WORKER_GRACE_MS - (Date.now() - apiStopping), 1_000);
        await open.bootstrap?.catch(() => {});
        // A worker still starting waits for the queue's connection: a store that is not up stops it.
        open.services?.queue.stopConnecting();
        const worker = await open.worker?.catch(() => undefined);
        // Bounded: a store that stopped answering holds the queue's last writes (the locks it gives
        // back, its notification channel), and the store's own close below names what hangs.
        if (worker) {
          await withTimeout(worker.stop(workerGraceMs), workerGraceMs + 1_000, "").then(
            () => log.info("job worker stopped"),
            (error) => {
              code ||= 1;
              if (error instanceof TimedOut) {
                log.warn(`the job worker did not stop within ${(workerGraceMs + 1_000) / 1000} s (the store may not be answering); its locks lapse instead`);
              } else log.error("the job worker failed to stop; its locks lapse instead", { error });
            },
          );
        }
        // Each closing step gets a share of what is left of the deadline, so the one that hangs is
        // named before the deadline ends the process.
        const stepMs = Math.min(5_000, Math.max(500, (signalledAt + SHUTDOWN_DEADLINE_MS - Date.now() - 1_000) / 3));
        if (open.services) await open.services.close({ stepMs }).then(() => log.info("store closed; bye"));
      } catch (error) {
        log.error("error while shutting down", { error });
        code ||= 1;
      }
      process.exit(code);
    })();
    return stopping;
  };
  // Installed before anything starts: a signal during start-up stops what is already open.
  for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"] as const) process.on(signal, () => void shutdown(signal));
  // Under npm, a SIGTERM to npm may not reach us: when our parent goes, we go.
  if (env.npm_execpath) {
    const parent = process.ppid;
    setInterval(() => {
      if (process.ppid !== parent) void shutdown("the npm process that started Engram exited");
    }, 500).unref();
  }

  try {
    open.services = await openServices(env, { log });
  } catch (error) {
    process.stderr.write(`${startFailure(error, env, "store")}\n`);
    process.exit(1);
  }
  const services = open.services;
  if (stopping) return;
  log.info("store ready", { kind: services.store.kind });
  services.store.onFailure((error) => void shutdown("the embedded database could not be restarted", 1, { error: error.message }));
  if (!modelsConfigured(env)) {
    log.warn("no model configured: compaction and other model-driven features are off (set OPENAI_API_KEY or OPENAI_BASE_URL)");
  }
  if (env.DATABASE_URL && !env.CHROMA_URL) {
    log.warn(
      `no CHROMA_URL: this instance keeps recall vectors in its own embedded Chroma under ${env.ENGRAM_DATA_DIR}/chroma; set CHROMA_URL when several instances share the database`,
    );
  }

  // The embedded Chroma starts now, beside the rest of start-up, instead of on first use: the
  // first recall after a start waited for all of its start (0.5-1 s), and recording a turn needs it soon anyway.
  // A start that fails is logged (chroma's onStartFailed), /healthz says down, and the next use tries again.
  void services.chroma.get().catch(() => {});

  const app = buildApp(services);
  let url: string;
  try {
    url = await app.start();
  } catch (error) {
    process.stderr.write(`${startFailure(error, env, "listen")}\n`);
    await shutdown("could not listen", 1);
    return;
  }
  open.app = app;
  // Only once the port is bound: a start that fails earlier creates nothing, so no key is lost.
  // The key is printed before the "listening" line, so whoever waits for that line has it.
  open.bootstrap = stopping ? undefined : bootstrapOnce(services, log);
  await open.bootstrap;
  log.info(`Engram is listening on ${url}/graphql (GraphiQL in a browser)`);
  // The worker starts once the API answers: queued work waits a moment, requests do not.
  if (env.ENGRAM_JOBS === "on" && !stopping) {
    open.worker = startWorker(services);
    await open.worker;
  }
}

async function bootstrapOnce(services: Services, log: Logger) {
  const first = await bootstrapFirstTenant(services.db);
  if (!first) return;
  log.info("created the first tenant; its admin key is printed once below", { tenantId: first.tenant.id });
  process.stdout.write(`ENGRAM_ADMIN_KEY=${first.adminKey}\n`);
  log.info(`lost it? \`npx engram keys create --role admin --tenant ${first.tenant.id}\` makes another, also with the server stopped`);
}

/**
 * Runs Engram in this process: the API, the job worker when ENGRAM_JOBS is on, and the ordered
 * shutdown on a signal. Resolves once started; any failure ends the process.
 */
export function runServer({ startWorker }: { startWorker: StartWorker }): Promise<void> {
  return serve(startWorker).catch((error) => {
    // A step of start-up that fails because shutdown closed what it used is part of that shutdown.
    if (stopping) return;
    process.stderr.write(`Engram failed: ${(error as Error)?.stack ?? error}\n`);
    process.exit(1);
  });
}
