import type { TenantDb } from "../db.ts";
import { publicReason } from "../errors.ts";
import type { JobStatus, Prisma } from "../generated/prisma/client.ts";
import type { PubSub } from "../pubsub.ts";

/** What a run says whose process stopped before it finished (jobRuns, the inspector). */
export const STOPPED_RUN = "the process running it stopped before it finished";

/** What a run says that this process's shutdown cut off (its job is retried). */
export const SHUT_DOWN_RUN = "cut off by a shutdown before it finished; the job is retried";

/** The runs this process is recording, so a shutdown that cuts them off can say so at once. */
const runningHere = new Map<string, { db: TenantDb; pubsub: PubSub }>();

/** How often a running run writes its sign of life. */
export const RUN_HEARTBEAT_MS = 60_000;

/** A RUNNING run with no sign of life for this long belonged to a process that stopped. */
const RUN_STALE_MS = 5 * RUN_HEARTBEAT_MS;

/**
 * Records one job's run for one tenant and announces it, so the inspector sees jobs live. While it
 * runs, it writes a sign of life every `heartbeatMs` (failRunsOfTheDead).
 */
export async function recordJobRun(
  db: TenantDb,
  pubsub: PubSub,
  name: string,
  work: () => Promise<{ status: Exclude<JobStatus, "RUNNING">; result: object }>,
  heartbeatMs = RUN_HEARTBEAT_MS,
) {
  const tenantId = db.$tenantId();
  const run = await db.jobRun.create({ data: { tenantId, name, status: "RUNNING", heartbeatAt: new Date() } });
  pubsub.publish("jobRunChanged", tenantId, { id: run.id });
  runningHere.set(run.id, { db, pubsub });
  // Not awaited in turn: a slow store delays a beat, never the work; one that fails is the next's to make.
  const heartbeat = setInterval(() => {
    db.jobRun.updateMany({ where: { id: run.id, status: "RUNNING" }, data: { heartbeatAt: new Date() } }).catch(() => {});
  }, heartbeatMs);
  heartbeat.unref();
  try {
    const { status, result } = await work();
    const finished = await db.jobRun.update({
      where: { id: run.id },
      data: { status, result: result as Prisma.InputJsonValue, finishedAt: new Date() },
    });
    pubsub.publish("jobRunChanged", tenantId, { id: run.id });
    return finished;
  } catch (error) {
    await db.jobRun.update({
      where: { id: run.id },
      data: { status: "FAILED", error: publicReason(error), finishedAt: new Date() },
    });
    pubsub.publish("jobRunChanged", tenantId, { id: run.id });
    throw error;
  } finally {
    clearInterval(heartbeat);
    runningHere.delete(run.id);
  }
}

/**
 * Marks FAILED, saying so, the runs this process is still recording: called by a shutdown whose
 * grace ran out, so jobRuns and the inspector say at once what was cut off instead of RUNNING
 * until the 5-minute sweep (failRunsOfTheDead). A run that still finishes writes its own end
 * over this. Bounded by the caller: a store that does not answer leaves them to the sweep.
 */
export async function failRunsCutOffHere(): Promise<number> {
  let count = 0;
  for (const [id, { db, pubsub }] of runningHere) count += await failRunning(db, pubsub, [id], SHUT_DOWN_RUN, new Date());
  return count;
}

/** Marks FAILED, with `error`, those of these runs still RUNNING, and announces them. */
async function failRunning(db: TenantDb, pubsub: PubSub, ids: string[], error: string, finishedAt: Date): Promise<number> {
  const { count } = await db.jobRun.updateMany({ where: { id: { in: ids }, status: "RUNNING" }, data: { status: "FAILED", error, finishedAt } });
  if (count) for (const id of ids) pubsub.publish("jobRunChanged", db.$tenantId(), { id });
  return count;
}

/**
 * The tenant's runs left RUNNING by a process that stopped (killed, its machine gone): no sign of
 * life for 5 minutes. They are marked FAILED, saying so, and announced. A run that was only cut off
 * from the store meanwhile and then finishes writes its own end over this. On the embedded store,
 * a start does the same at once for every run (its one process owns them all: services.ts).
 */
export async function failRunsOfTheDead(db: TenantDb, pubsub: PubSub, now = new Date()): Promise<number> {
  const stale = new Date(now.getTime() - RUN_STALE_MS);
  const dead = await db.jobRun.findMany({
    where: { status: "RUNNING", OR: [{ heartbeatAt: { lt: stale } }, { heartbeatAt: null, startedAt: { lt: stale } }] },
    select: { id: true },
  });
  if (dead.length === 0) return 0;
  return failRunning(db, pubsub, dead.map((run) => run.id), STOPPED_RUN, now);
}
