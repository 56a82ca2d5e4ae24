import { PostgresBackend } from "@agendajs/postgres-backend";
import { Agenda } from "agenda";
import type { Services } from "../src/services.ts";
import { compactJob, COMPACTION_CRON, runCompaction } from "./compact.ts";

export type Worker = { agenda: Agenda; stop(): Promise<void> };

/**
 * Agenda on the same database as everything else. On PGlite, LISTEN/NOTIFY does not reach
 * other connections, so jobs wait for the poll instead.
 */
export async function startWorker(services: Services): Promise<Worker> {
  const { store, env, log } = services;
  const agenda = new Agenda({
    backend: new PostgresBackend({
      poolConfig: { connectionString: store.url, max: 3, allowExitOnIdle: true },
      disableNotifications: store.embedded,
    }),
    processEvery: env.ENGRAM_JOB_POLL_MS,
  });
  agenda.on("error", (error) => log.error("job queue error", { error }));
  agenda.on("fail", (error, job) => log.warn("job failed", { job: job.attrs.name, error }));

  agenda.define(compactJob.name, async (job) => {
    await runCompaction(services, compactJob.schema.parse(job.attrs.data ?? {}));
  });

  await agenda.start();
  await agenda.every(COMPACTION_CRON, compactJob.name, {}, { timezone: "UTC", skipImmediate: true });
  return {
    agenda,
    async stop() {
      await agenda.stop(true);
    },
  };
}
