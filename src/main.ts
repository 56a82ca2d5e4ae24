import { startWorker, type Worker } from "../jobs/worker.ts";
import { buildApp } from "./app.ts";
import { EnvError, modelsConfigured, readEnv } from "./env.ts";
import { createLogger } from "./log.ts";
import { bootstrapFirstTenant } from "./auth.ts";
import { openServices } from "./services.ts";

async function main() {
  const env = readEnv();
  const log = createLogger(env.ENGRAM_LOG_LEVEL);
  const services = await openServices(env, { log });
  log.info("store ready", { kind: services.store.kind });

  const first = await bootstrapFirstTenant(services.db);
  if (first) {
    log.info("created the first tenant; its admin key is printed once below", { tenantId: first.tenant.id });
    process.stdout.write(`ENGRAM_ADMIN_KEY=${first.adminKey}\n`);
  }
  if (!modelsConfigured(env)) {
    log.warn("no model configured: compaction and other model-driven features are off (set OPENAI_API_KEY or OPENAI_BASE_URL)");
  }

  let worker: Worker | undefined;
  if (env.ENGRAM_JOBS === "on") worker = await startWorker(services);
  const app = buildApp(services);
  const url = await app.start();
  log.info(`Engram is listening on ${url}/graphql (GraphiQL in a browser)`);

  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info("shutting down", { signal });
    await app.stop();
    log.info("API stopped");
    if (worker) {
      await worker.stop();
      log.info("job worker stopped");
    }
    await services.close();
    log.info("store closed; bye");
    process.exit(0);
  };
  process.on("SIGINT", () => void shutdown("SIGINT"));
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
}

main().catch((error) => {
  if (error instanceof EnvError) {
    process.stderr.write(`${error.message}\n`);
  } else {
    process.stderr.write(`Engram failed to start: ${(error as Error).stack ?? error}\n`);
  }
  process.exit(1);
});
