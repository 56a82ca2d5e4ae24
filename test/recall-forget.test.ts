import type { ChromaClient } from "chromadb";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { settingsChanged } from "../src/governance/settings.ts";
import { forTenant } from "../src/db.ts";
import { forgetConversation, forgetSnippets, forgetUser } from "../src/memory/forget.ts";
import { runIndexSnippets } from "../src/work/index-snippets.ts";
import { retentionJob } from "../src/queue.ts";
import { retentionSweep } from "../src/work/retention.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { allIndexed, chromaOf, RECALL, say } from "./helpers/recall.ts";
import { recordTurn } from "./helpers/turns.ts";
import { until } from "./helpers/until.ts";

// Forgetting and retention remove rows and vectors; Chroma is checked directly.
let engram: TestEngram;
let chroma: ChromaClient;
const DAY = 86_400_000;
const now = new Date("2025-06-01T03:00:00Z");

async function sayAt(user: string, conversation: string, daysAgo: number, text: string, key = engram.tenant.writer) {
  const turn = await recordTurn(
    engram,
    {
      agentExternalId: "shop",
      endUserExternalId: user,
      conversationExternalId: conversation,
      userMessage: text,
      assistantMessage: "Noted.",
      occurredAt: new Date(now.getTime() - daysAgo * DAY).toISOString(),
    },
    key,
  );
  return turn.conversation;
}

const snippetIds = (where: object) =>
  engram.services.db.recallSnippet.findMany({ where, select: { id: true }, orderBy: { id: "asc" } }).then((rows) => rows.map((r) => r.id));

/** The snippet ids Chroma holds for a tenant (all its collections). */
async function vectorsOf(tenantId: string, where?: object) {
  const ids: string[] = [];
  for (const c of await chroma.listCollections({ limit: 1000 })) {
    if (c.name.startsWith(`engram-${tenantId}-`)) ids.push(...(await c.get({ ...(where ? { where: where as never } : {}), include: [] })).ids);
  }
  return ids.sort();
}

beforeAll(async () => {
  engram = await startTestEngram({ worker: true });
}, 120_000);
afterAll(async () => {
  await engram?.stop();
});

describe("forgetting recall", () => {
  it("forgetUser deletes one user's snippets and vectors, and nobody else's", async () => {
    const erin = await say(engram, { user: "erin", conversation: "e-1" }, "My locker code is 4417.", "Saved.");
    await say(engram, { user: "erin", conversation: "e-2" }, "I prefer aisle seats.", "Noted.");
    const frank = await say(engram, { user: "frank", conversation: "f-1" }, "My locker code is 9921.", "Saved.");
    await say(engram, { user: "erin", conversation: "e-other" }, "My locker code is 1234.", "Saved.", engram.other.writer);
    await allIndexed(engram);
    await allIndexed(engram, engram.other.tenantId);
    chroma = chromaOf(engram);
    const erinSnippets = await snippetIds({ endUserId: erin.endUserId });
    expect(erinSnippets).toHaveLength(2);
    expect(await vectorsOf(engram.tenant.tenantId, { endUserId: erin.endUserId })).toEqual(erinSnippets);

    const scoped = forTenant(engram.services.db, engram.tenant.tenantId);
    expect((await forgetUser(scoped, engram.services.deps, erin.endUserId, { reason: "test" })).snippets).toBe(2);
    expect(await snippetIds({ endUserId: erin.endUserId })).toEqual([]);
    expect(await vectorsOf(engram.tenant.tenantId, { endUserId: erin.endUserId })).toEqual([]);
    expect(await vectorsOf(engram.tenant.tenantId, { endUserId: frank.endUserId })).toHaveLength(1);
    expect(await vectorsOf(engram.other.tenantId)).toHaveLength(1);
    const recalled = await engram.gql(RECALL, { input: { endUserId: erin.endUserId, text: "what is my locker code?" } });
    expect(recalled.data.recall.candidates).toEqual([]);
  });

  it("through the API: forgetUser, deleteFact (its source snippet) and deleteConversation remove the vectors too", async () => {
    chroma = chromaOf(engram);
    const gina = await say(engram, { user: "gina", conversation: "g-1" }, "My cat is called Miso.", "Cute.");
    const second = await say(engram, { user: "gina", conversation: "g-2" }, "I work night shifts.", "Noted.");
    await say(engram, { user: "gina", conversation: "g-3" }, "I like rainy days.", "Me too.");
    await allIndexed(engram);
    const g2Snippets = await snippetIds({ conversationId: second.conversationId });
    expect(await vectorsOf(engram.tenant.tenantId, { conversationId: second.conversationId })).toEqual(g2Snippets);

    // A fact extracted from a message: deleting it removes the snippet that holds the message.
    const message = await engram.services.db.message.findFirstOrThrow({ where: { conversationId: gina.conversationId, role: "USER" } });
    const fact = await engram.services.db.fact.create({
      data: { tenantId: engram.tenant.tenantId, endUserId: gina.endUserId, text: "The user's cat is called Miso.", origin: "EXTRACTOR", sourceMessageId: message.id },
    });
    const catSnippets = await snippetIds({ messageIds: { has: message.id } });
    expect(catSnippets).toHaveLength(1);
    await engram.gql(`mutation($id: ID!) { deleteFact(id: $id) { change } }`, { id: fact.id });
    expect(await snippetIds({ id: { in: catSnippets } })).toEqual([]);
    expect((await vectorsOf(engram.tenant.tenantId)).filter((id) => catSnippets.includes(id))).toEqual([]);

    const deleted = await engram.gql(`mutation($id: ID!) { deleteConversation(id: $id) { messages snippets } }`, { id: second.conversationId });
    expect(deleted.data.deleteConversation.snippets).toBe(g2Snippets.length);
    expect(await vectorsOf(engram.tenant.tenantId, { conversationId: second.conversationId })).toEqual([]);
    expect(await engram.services.db.message.count({ where: { conversationId: second.conversationId } })).toBe(0);

    const forgotten = await engram.gql(`mutation($id: ID!) { forgetUser(endUserId: $id) { facts snippets } }`, { id: gina.endUserId });
    expect(forgotten.data.forgetUser.snippets).toBeGreaterThan(0);
    expect(await snippetIds({ endUserId: gina.endUserId })).toEqual([]);
    expect(await vectorsOf(engram.tenant.tenantId, { endUserId: gina.endUserId })).toEqual([]);
  });

  it("a forget request's turn indexed after its job forgot (messages kept): no snippet brings back what it named", async () => {
    const { tenantId, admin, writer } = engram.tenant;
    const setting = (keep: boolean) =>
      engram.gql(`mutation($on: Boolean!) { updateTenantSettings(input: { forgetDeletesMessages: $on }) { forgetDeletesMessages } }`, { on: !keep }, admin);
    await setting(true);
    // No model work for the agent: its turns are batched, and the forget request goes to its own job.
    await engram.gql(`mutation { upsertAgent(input: { externalId: "quiet-shop", settings: { summaryOn: false, extractionOn: false } }) { id } }`, {}, admin);
    try {
    const db = forTenant(engram.services.db, tenantId);
    const kept = await recordTurn(engram, { agentExternalId: "quiet-shop", endUserExternalId: "fern", conversationExternalId: "fern-1", userMessage: "My bike is a red Brompton.", assistantMessage: "Nice." }, writer);
    const asking = await recordTurn(engram, { agentExternalId: "quiet-shop", endUserExternalId: "fern", conversationExternalId: "fern-1", userMessage: "Please forget my bike.", assistantMessage: "Forgotten." }, writer);
    await until("the forget request's job", async () =>
      (await db.turn.count({ where: { id: asking.id, followUpsQueuedAt: { not: null } } })) === 1 &&
      (await db.message.count({ where: { conversationId: asking.conversation.id, forgottenAt: { not: null } } })) === 2,
    );
    await allIndexed(engram, tenantId);
    // Its index job runs late (after the forget): the messages are still there, the snippet is not made.
    await runIndexSnippets(db, engram.services.deps, { tenantId, conversationId: asking.conversation.id, firstSeq: asking.firstSeq, lastSeq: asking.lastSeq });
    expect(await db.message.count({ where: { conversationId: asking.conversation.id, content: { contains: "bike" } } })).toBe(2);
    expect(await db.recallSnippet.count({ where: { conversationId: asking.conversation.id, text: { contains: "bike" } } })).toBe(0);
    expect(kept.firstSeq).toBe(1);
    } finally {
      await setting(false);
    }
  }, 120_000);

  it("forgetSnippets and forgetConversation delete exactly what they name", async () => {
    const g1 = await say(engram, { user: "gina", conversation: "g-1" }, "I like green tea.", "Noted.");
    await say(engram, { user: "gina", conversation: "g-1" }, "And oat milk.", "Noted.");
    const g2 = await say(engram, { user: "gina", conversation: "g-2" }, "Ship to my office.", "Will do.");
    await allIndexed(engram);
    const [first, second] = await snippetIds({ conversationId: g1.conversationId });
    await forgetSnippets(forTenant(engram.services.db, engram.tenant.tenantId), engram.services.deps, [first]);
    expect(await vectorsOf(engram.tenant.tenantId, { conversationId: g1.conversationId })).toEqual([second]);
    // Another tenant naming the snippet deletes nothing.
    await forgetSnippets(forTenant(engram.services.db, engram.other.tenantId), engram.services.deps, [second]);
    expect(await snippetIds({ conversationId: g1.conversationId })).toEqual([second]);
    expect(await vectorsOf(engram.tenant.tenantId, { conversationId: g1.conversationId })).toEqual([second]);

    await forgetConversation(forTenant(engram.services.db, engram.tenant.tenantId), engram.services.deps, g1.conversationId, { reason: "test" });
    expect(await vectorsOf(engram.tenant.tenantId, { conversationId: g1.conversationId })).toEqual([]);
    expect(await vectorsOf(engram.tenant.tenantId, { conversationId: g2.conversationId })).toHaveLength(1);
  });
});

describe("nightly retention", () => {
  it("deletes snippets and facts older than the window, keeps restated facts, and keeps all with 0 days", async () => {
    const tenantId = engram.tenant.tenantId;
    await engram.services.db.tenantSettings.upsert({
      where: { tenantId },
      create: { tenantId, retentionDays: 30 },
      update: { retentionDays: 30 },
    });
    settingsChanged(engram.tenant.tenantId); // written past updateTenantSettings
    const old = await sayAt("hana", "h-old", 31, "My old order was a red kettle.");
    const recent = await sayAt("hana", "h-recent", 29, "My recent order was a blue toaster.");
    const otherTenant = await sayAt("hana", "h-other", 400, "An ancient order of a teapot.", engram.other.writer);
    await allIndexed(engram);
    await allIndexed(engram, engram.other.tenantId);

    const db = forTenant(engram.services.db, tenantId);
    const fact = (text: string, createdDaysAgo: number, confirmedDaysAgo: number) =>
      db.fact.create({
        data: {
          tenantId,
          endUserId: old.endUser.id,
          text,
          origin: "API",
          createdAt: new Date(now.getTime() - createdDaysAgo * DAY),
          confirmedAt: new Date(now.getTime() - confirmedDaysAgo * DAY),
        },
      });
    // The gate's verdicts: one stored before the window, one within it, and one of the other tenant's (0 days).
    const verdict = (tenant: string, conversationId: string, hash: string, daysAgo: number) =>
      engram.services.db.gateVerdict.create({
        data: { tenantId: tenant, conversationId, messageHash: hash, remember: false, forget: "SOME", forgetTargets: ["my locker code"], needsRecall: false, decidedBy: "MODEL", createdAt: new Date(now.getTime() - daysAgo * DAY) },
      });
    // The old conversation's turns are judged; the recent one has a turn still to judge, whose
    // conversation keeps even a verdict from before the window.
    await engram.services.db.turn.updateMany({ where: { conversationId: old.id }, data: { gatedAt: now } });
    await engram.services.db.turn.updateMany({ where: { conversationId: recent.id }, data: { gatedAt: null } });
    await verdict(tenantId, old.id, "old-verdict", 31);
    const keptVerdict = await verdict(tenantId, recent.id, "recent-verdict", 29);
    const pendingVerdict = await verdict(tenantId, recent.id, "pending-verdict", 31);
    const otherVerdict = await verdict(engram.other.tenantId, otherTenant.id, "other-verdict", 400);
    const stale = await fact("Hana lives in Porto.", 31, 31);
    const fresh = await fact("Hana is vegetarian.", 29, 29);
    const restated = await fact("Hana has a cat.", 300, 1);

    await engram.services.db.tenantSettings.upsert({
      where: { tenantId: engram.other.tenantId },
      create: { tenantId: engram.other.tenantId, retentionDays: 0 },
      update: { retentionDays: 0 },
    });
    settingsChanged(engram.other.tenantId); // written past updateTenantSettings
    const { done: runs } = await retentionSweep(engram.services.deps, {}, now);
    const mine = runs.find((r) => r.tenantId === tenantId)!;
    expect(mine.status).toBe("SUCCEEDED");
    expect(mine.result).toMatchObject({ retentionDays: 30, snippetsDeleted: 1, factsDeleted: 1, verdictsDeleted: 1 });
    const verdictsLeft = await engram.services.db.gateVerdict.findMany({ where: { messageHash: { in: ["old-verdict", "recent-verdict", "pending-verdict", "other-verdict"] } } });
    expect(verdictsLeft.map((v) => v.id).sort()).toEqual([keptVerdict.id, pendingVerdict.id, otherVerdict.id].sort());

    expect(await snippetIds({ conversationId: old.id })).toEqual([]);
    expect(await vectorsOf(tenantId, { conversationId: old.id })).toEqual([]);
    expect(await snippetIds({ conversationId: recent.id })).toHaveLength(1);
    expect(await vectorsOf(tenantId, { conversationId: recent.id })).toHaveLength(1);
    const left = (await db.fact.findMany({ where: { endUserId: old.endUser.id } })).map((f) => f.id).sort();
    expect(left).toEqual([fresh.id, restated.id].sort());
    expect(left).not.toContain(stale.id);

    // The other tenant keeps everything until forgotten (0 days); its default would be 180.
    expect(runs.find((r) => r.tenantId === engram.other.tenantId)?.result).toMatchObject({ retentionDays: 0, snippetsDeleted: 0 });
    expect(await snippetIds({ conversationId: otherTenant.id })).toHaveLength(1);
    expect(await vectorsOf(engram.other.tenantId, { conversationId: otherTenant.id })).toHaveLength(1);

    const jobRuns = await engram.gql(`{ jobRuns { name status } }`).catch(() => null);
    if (jobRuns?.data) expect(jobRuns.data.jobRuns.some((r: any) => r.name === "memory.retention")).toBe(true);
  });

  it("tries a tenant whose run failed again on its own a minute later, not the next night", async () => {
    const tenantId = engram.tenant.tenantId; // 30 days since the test above
    const old = await sayAt("ivo", "ivo-old", 31, "My old order was a grey scarf.");
    await allIndexed(engram);
    const { deps } = engram.services;
    // The store refuses this tenant's reads, as when it is away or its disk is full.
    const storeAway = (db: ReturnType<typeof deps.tenants.scoped>) =>
      new Proxy(db, { get: (target, key) => (key === "tenantSettings" ? { findUnique: () => Promise.reject(new Error("the store is away")) } : Reflect.get(target, key)) });
    const failing = { ...deps, tenants: { ...deps.tenants, scoped: (id: string) => (id === tenantId ? storeAway(deps.tenants.scoped(id)) : deps.tenants.scoped(id)) } };
    const { done, failed } = await retentionSweep(failing, {}, now);
    expect(done.map((r) => r.tenantId)).not.toContain(tenantId); // its FAILED run is in jobRuns (below)
    expect(failed).toEqual([{ tenantId, error: new Error("the store is away") }]);
    expect((await deps.queue.waiting(retentionJob, "tenantId", [tenantId, engram.other.tenantId])).has(tenantId)).toBe(true);
    expect((await deps.queue.waiting(retentionJob, "tenantId", [engram.other.tenantId])).size).toBe(0);
    // Failing again (the next night) queues no second retry.
    await retentionSweep(failing, {}, now);
    const retries = await engram.services.db.$queryRawUnsafe<{ n: number }[]>(
      `SELECT count(*)::int AS "n" FROM "agenda_jobs" WHERE "name" = 'memory.retention' AND "data"->>'tenantId' = $1`,
      tenantId,
    );
    expect(retries[0].n).toBe(1);
    // That run throws while it fails, so the queue retries it with its backoff; then it does the work.
    await expect(retentionSweep(failing, { tenantId }, now)).rejects.toThrow(/retention of the tenant failed/);
    const { done: [retried] } = await retentionSweep(deps, { tenantId }, now);
    expect(retried).toMatchObject({ tenantId, status: "SUCCEEDED", result: { snippetsDeleted: 1 } });
    expect(await snippetIds({ conversationId: old.id })).toEqual([]);
    const failedRuns = await engram.services.db.jobRun.count({ where: { tenantId, name: "memory.retention", status: "FAILED" } });
    expect(failedRuns).toBe(3);
  });

  it("drops the queue's records of jobs that finished more than a day before, whatever the window", async () => {
    const db = engram.services.db;
    const tenantId = engram.other.tenantId; // retentionDays 0 since the test above
    await sayAt("ines", "i-1", 1, "My order was a green lamp.", engram.other.writer);
    await sayAt("ines", "i-2", 1, "My order was a blue lamp.", engram.other.writer);
    await allIndexed(engram, tenantId, 30_000, ["memory.summarize", "memory.extract"]);
    type Row = { id: string; name: string; finished: boolean; next: boolean };
    const records = () =>
      db.$queryRaw<Row[]>`
        SELECT "id"::text AS "id", "name", "last_finished_at" IS NOT NULL AS "finished", "next_run_at" IS NOT NULL AS "next"
        FROM "agenda_jobs" WHERE "data"->>'tenantId' = ${tenantId} ORDER BY "id"`;
    const finished = (await records()).filter((r) => r.finished && !r.next);
    expect(finished.length).toBeGreaterThan(2);
    // Two finished records made to look like what must stay: one failed and waiting for its retry
    // (a next run), one running again (locked).
    const [retrying, running] = finished;
    await db.$executeRaw`UPDATE "agenda_jobs" SET "next_run_at" = now() + interval '1 hour' WHERE "id" = ${retrying.id}::uuid`;
    await db.$executeRaw`UPDATE "agenda_jobs" SET "locked_at" = now() WHERE "id" = ${running.id}::uuid`;

    // Half a day later nothing has aged enough; two days later every other finished record goes.
    const inDays = (days: number) => new Date(Date.now() + days * DAY);
    const { done: halfDayLater } = await retentionSweep(engram.services.deps, { tenantId }, inDays(0.5));
    expect(halfDayLater[0].result).toMatchObject({ finishedJobsDeleted: 0 });
    const { done: later } = await retentionSweep(engram.services.deps, { tenantId }, inDays(2));
    // At least those (a job of the tenant still running meanwhile may finish, and be old enough, too).
    expect(later[0].result).toMatchObject({ retentionDays: 0 });
    expect((later[0].result as { finishedJobsDeleted: number }).finishedJobsDeleted).toBeGreaterThanOrEqual(finished.length - 2);
    const left = new Set((await records()).map((r) => r.id));
    expect(finished.filter((r) => left.has(r.id)).map((r) => r.id)).toEqual([retrying.id, running.id]);
    await db.$executeRaw`UPDATE "agenda_jobs" SET "locked_at" = NULL, "next_run_at" = NULL WHERE "id" IN (${retrying.id}::uuid, ${running.id}::uuid)`;
    // The other tenant's records are its own sweep's.
    const mine = await db.$queryRaw<{ n: number }[]>`
      SELECT count(*)::int AS "n" FROM "agenda_jobs" WHERE "data"->>'tenantId' = ${engram.tenant.tenantId} AND "last_finished_at" IS NOT NULL`;
    expect(mine[0].n).toBeGreaterThan(0);
  });
});

describe("a forget request read by the keyword gate (no model)", () => {
  const writer = () => engram.tenant.writer;
  /** The user's turn, then its work (the gate, and what it asks to forget) done. */
  async function ask(user: string, message: string) {
    const asked = await say(engram, { user, conversation: `${user}-ask` }, message, "Done.");
    const db = forTenant(engram.services.db, engram.tenant.tenantId);
    await until("the forget request to be judged", async () => (await db.turn.count({ where: { id: asked.turnId, gatedAt: { not: null } } })) === 1, 60_000);
    return db;
  }

  it("forgets only what \"forget all my X\" or \"forget everything about my X\" names, not everything about the user", async () => {
    for (const [user, request] of [
      ["hugo", "Please forget all my old addresses."],
      ["hilde", "Forget everything about my old address."],
    ]) {
      const old = await say(engram, { user, conversation: `${user}-1` }, "My old address was 9 Birch Road.", "Noted.");
      await say(engram, { user, conversation: `${user}-2` }, "I love green tea.", "Noted.");
      const fact = await engram.gql(`mutation($input: AddFactInput!) { addFact(input: $input) { id } }`, { input: { endUserExternalId: user, text: "The user is vegetarian." } }, writer());
      const db = await ask(user, request);
      expect(await db.message.count({ where: { conversationId: old.conversationId, content: { contains: "Birch" } } })).toBe(0);
      expect(await db.message.count({ where: { conversation: { endUserId: old.endUserId }, content: { contains: "green tea" } } })).toBe(1);
      expect(await db.fact.count({ where: { id: fact.data.addFact.id } })).toBe(1);
    }
  }, 180_000);

  it("forgets what it names when the request goes on with courtesies, or names what was given, or several things", async () => {
    for (const [user, said, request] of [
      ["ines", ["My home address is 4 Elm Street."], "Please forget my home address, thanks."],
      ["jon", ["My door code is 5521."], "Forget the door code I gave you!"],
      ["kai", ["My address is 7 Oak Lane.", "My phone number is 555 0199."], "Please forget my address and my phone number."],
    ] as const) {
      const turns = [];
      for (const [n, message] of said.entries()) turns.push(await say(engram, { user, conversation: `${user}-${n}` }, message, "Noted."));
      const db = await ask(user, request);
      for (const turn of turns) expect(await db.message.count({ where: { conversationId: turn.conversationId, role: "USER" } })).toBe(0);
    }
  }, 180_000);
});
