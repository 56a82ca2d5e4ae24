import type { TenantDb } from "../db.ts";
import { publicReason } from "../errors.ts";
import type { JobStatus, Prisma } from "../generated/prisma/client.ts";
import type { PubSub } from "../pubsub.ts";

/** Records one job's run for one tenant and announces it, so the inspector sees jobs live. */
export async function recordJobRun(
  db: TenantDb,
  pubsub: PubSub,
  name: string,
  work: () => Promise<{ status: Exclude<JobStatus, "RUNNING">; result: object }>,
) {
  const tenantId = db.$tenantId();
  const run = await db.jobRun.create({ data: { tenantId, name, status: "RUNNING" } });
  pubsub.publish("jobRunChanged", tenantId, { id: run.id });
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
  }
}
