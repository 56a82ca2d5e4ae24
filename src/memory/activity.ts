import { randomUUID } from "node:crypto";
import { z } from "zod";
import { insertRows, type ColumnTypes, type TenantDb, type TenantDirectory } from "../db.ts";
import { badInput } from "../errors.ts";
import type { Prisma } from "../generated/prisma/client.ts";
import { textProblem } from "../limits.ts";
import type { Logger } from "../log.ts";
import type { PubSub, RecallCandidate, Topics } from "../pubsub.ts";
import { aboutThePerson } from "./export.ts";
import { feedScope, type FeedFilter, type FeedPayload } from "./feed-filter.ts";

/**
 * The feed's history. Every announcement leaves one ActivityLog row of ids and kinds (never a
 * copy of content: items re-read their rows, so what was forgotten is gone from the history too),
 * written where the domain announces: a wrapper around the pubsub, so no announcer can skip it
 * and a CLI run (its own process, its own pubsub) lands in the same history as the server's.
 */
export type FeedKind = FeedPayload["kind"];
export const FEED_KINDS: FeedKind[] = ["SUMMARY_REVISION", "TURN", "EVENT", "ENTRY", "JOB_RUN", "FACT", "RECALL"];

type Row = Omit<Prisma.ActivityLogUncheckedCreateInput, "tenantId">;
type Payload<T extends keyof Topics> = Topics[T][1];

/** What a recall's history keeps: the candidates' ids and scores; texts are re-read from the snippets. */
type RecallDetail = {
  chosenBy: "JUDGE" | "FLOOR";
  degraded: string | null;
  candidates: (Omit<RecallCandidate, "text" | "occurredAt"> & { occurredAt: string })[];
};

/** One row per announcement and no reads: a conversation's agent and user are looked up when the history is read. */
function rowOf<T extends keyof Topics>(topic: T, payload: Payload<T>): Row {
  switch (topic) {
    case "summaryChanged": {
      const p = payload as Payload<"summaryChanged">;
      return { kind: "SUMMARY_REVISION", refId: p.revisionId, conversationId: p.conversationId };
    }
    case "turnRecorded": {
      const p = payload as Payload<"turnRecorded">;
      return { kind: "TURN", refId: p.turnId, conversationId: p.conversationId, agentId: p.agentId };
    }
    case "eventAppended": {
      const p = payload as Payload<"eventAppended">;
      return { kind: "EVENT", refId: p.id, scope: p.scope, scopeRef: p.scopeRef };
    }
    case "entryChanged": {
      const p = payload as Payload<"entryChanged">;
      return { kind: "ENTRY", refId: p.id, change: p.change, scope: p.scope, scopeRef: p.scopeRef };
    }
    case "jobRunChanged":
      return { kind: "JOB_RUN", refId: (payload as Payload<"jobRunChanged">).id };
    case "factChanged": {
      // The fact's text and the reason stay out: they are content.
      const p = payload as Payload<"factChanged">;
      return { kind: "FACT", refId: p.factId, change: p.change, conversationId: p.conversationId, endUserId: p.endUserId };
    }
    case "memoryRecall": {
      const p = payload as Payload<"memoryRecall">;
      const detail: RecallDetail = {
        chosenBy: p.chosenBy,
        degraded: p.degraded,
        candidates: p.candidates.map(({ text: _text, occurredAt, ...ids }) => ({ ...ids, occurredAt: new Date(occurredAt).toISOString() })),
      };
      return {
        kind: "RECALL",
        refId: p.id,
        conversationId: p.conversationId,
        endUserId: p.endUserId,
        detail: detail as unknown as Prisma.InputJsonValue,
      };
    }
  }
  throw new Error(`No feed kind for topic ${String(topic)}`);
}

const ACTIVITY_COLUMNS: ColumnTypes = {
  id: "text",
  kind: "text",
  refId: "text",
  change: "text",
  agentId: "text",
  endUserId: "text",
  conversationId: "text",
  scope: "text",
  scopeRef: "text",
  detail: "jsonb",
  at: "timestamp(3)",
};

/** Stores announcements' rows together (insertRows); a job run keeps one row, its latest. */
async function recordActivities(db: TenantDb, rows: (Row & { id: string })[]) {
  const jobRuns = rows.filter((row) => row.kind === "JOB_RUN").map((row) => row.refId!);
  const latest = new Map(rows.map((row, i) => [row.kind === "JOB_RUN" ? `job:${row.refId}` : `row:${i}`, row]));
  if (jobRuns.length) await db.activityLog.deleteMany({ where: { kind: "JOB_RUN", refId: { in: jobRuns } } });
  await insertRows(db, "ActivityLog", ACTIVITY_COLUMNS, [...latest.values()]);
}

type Announcement = { topic: keyof Topics; payload: unknown; row: (Row & { id: string }) | null };

/**
 * A pubsub that records each announcement before passing it on (with `activityId`, the history
 * row's id and `activityAt` its time, so a live item and its history row are one item). Per
 * tenant the writes run one at a time and in order, so subscribers hear announcements in the
 * order they were made; the announcements made while a write is out are stored together by the
 * next one (insertRows). Each row's `at` is taken when it is announced, a millisecond after the
 * tenant's previous one at least, so within a process the history's order is the announcements'.
 */
export function recordingActivity(pubsub: PubSub, tenants: Pick<TenantDirectory, "scoped">, log: Logger): PubSub {
  const pass = pubsub.publish as (topic: keyof Topics, tenantId: string, payload: unknown) => void;
  const waiting = new Map<string, Announcement[]>();
  const writing = new Map<string, Promise<void>>();
  const lastAt = new Map<string, number>();
  // Runs until the tenant has nothing waiting, and stops being the tenant's write in the same
  // step as it finds nothing, so an announcement made after that starts the next one.
  const write = async (tenantId: string) => {
    for (;;) {
      const batch = waiting.get(tenantId);
      if (!batch?.length) {
        writing.delete(tenantId);
        return;
      }
      waiting.delete(tenantId);
      const rows = batch.flatMap((a) => (a.row ? [a.row] : []));
      let stored = false;
      try {
        if (rows.length) await recordActivities(tenants.scoped(tenantId), rows);
        stored = true;
      } catch (error) {
        log.warn("could not record announcements in the feed's history", { rows: rows.length, error });
      }
      for (const { topic, payload, row } of batch) {
        try {
          const recorded = stored && row ? { activityId: row.id, activityAt: (row.at as Date).toISOString() } : {};
          pass(topic, tenantId, { ...(payload as object), ...recorded });
        } catch (error) {
          log.warn("could not pass an announcement on", { topic, error });
        }
      }
    }
  };
  const publish = (<T extends keyof Topics>(topic: T, tenantId: string, payload: Payload<T>) => {
    // Announcements to every instance (a revoked key) are not a tenant's and have no feed row.
    if (tenantId === "all") return pass(topic, tenantId, payload);
    const at = Math.max(Date.now(), (lastAt.get(tenantId) ?? 0) + 1);
    lastAt.set(tenantId, at);
    let row: Announcement["row"] = null;
    try {
      row = { ...rowOf(topic, payload), id: randomUUID(), at: new Date(at) };
    } catch (error) {
      log.warn("an announcement has no feed row", { topic, error });
    }
    const queue = waiting.get(tenantId) ?? waiting.set(tenantId, []).get(tenantId)!;
    queue.push({ topic, payload, row });
    // Started on the next microtask, so it is the tenant's write before it can finish.
    if (!writing.has(tenantId)) writing.set(tenantId, Promise.resolve().then(() => write(tenantId)));
  }) as PubSub["publish"];
  const settled = async () => {
    while (writing.size) await Promise.all([...writing.values()]);
  };
  return {
    ...pubsub,
    publish,
    subscribe: pubsub.subscribe.bind(pubsub) as PubSub["subscribe"],
    settled,
    async close() {
      await settled();
      await pubsub.close();
    },
  };
}

export type HistoryArgs = FeedFilter & {
  kinds?: FeedKind[] | null;
  since?: Date | null;
  until?: Date | null;
  first: number;
  /** The endCursor of the previous page. */
  after?: string | null;
};

/**
 * A page's end is its last row's sort key (time, id), not the row itself: a job run's row is
 * replaced as the run moves on and a forget deletes rows, and paging must go on past them.
 */
const feedCursor = z.tuple([z.iso.datetime(), z.string().min(1).refine((id) => !textProblem(id))]);

function cursorOf(row: { at: Date; id: string }) {
  return Buffer.from(JSON.stringify([row.at.toISOString(), row.id])).toString("base64url");
}

function readCursor(cursor: string) {
  let key: unknown = null;
  try {
    key = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8"));
  } catch {
    // Not JSON: refused below with the rest.
  }
  const parsed = feedCursor.safeParse(key);
  if (!parsed.success) throw badInput("`after` is not a cursor of the feed: pass a page's endCursor.");
  return { at: new Date(parsed.data[0]), id: parsed.data[1] };
}

async function filterWhere(db: TenantDb, wanted: FeedFilter): Promise<Prisma.ActivityLogWhereInput> {
  if (!wanted.agentId && !wanted.endUserId && !wanted.conversationId) return {};
  const { scopeRefs, endUserIds } = await feedScope(db, wanted);
  const conversations = await db.conversation.findMany({
    where: {
      ...(wanted.conversationId && { id: wanted.conversationId }),
      ...(wanted.agentId && { agentId: wanted.agentId }),
      ...(wanted.endUserId && { endUserId: wanted.endUserId }),
    },
    select: { id: true },
  });
  const inConversation: Prisma.ActivityLogWhereInput = {
    kind: { in: ["SUMMARY_REVISION", "TURN", "FACT", "RECALL"] },
    conversationId: { in: conversations.map((c) => c.id) },
  };
  return {
    OR: [
      inConversation,
      { kind: { in: ["EVENT", "ENTRY"] }, scopeRef: { in: [...scopeRefs] } },
      // As the live filter: a user's facts and recalls, wherever they came from, unless an agent is picked.
      ...(wanted.agentId ? [] : [{ kind: { in: ["FACT", "RECALL"] }, endUserId: { in: [...endUserIds] } }]),
    ],
  };
}

/** Drops rows whose item can no longer be read (its row deleted), so a page never fails on one. */
async function readable(db: TenantDb, rows: { kind: string; refId: string | null; endUserId: string | null }[]) {
  const ids = (kind: string) => rows.filter((r) => r.kind === kind && r.refId).map((r) => r.refId!);
  const found = (list: { id: string }[]) => new Set(list.map((r) => r.id));
  const [revisions, turns, events, runs, users] = await Promise.all([
    db.summaryRevision.findMany({ where: { id: { in: ids("SUMMARY_REVISION") } }, select: { id: true } }).then(found),
    db.turn.findMany({ where: { id: { in: ids("TURN") } }, select: { id: true } }).then(found),
    db.memoryEvent.findMany({ where: { id: { in: ids("EVENT") } }, select: { id: true } }).then(found),
    db.jobRun.findMany({ where: { id: { in: ids("JOB_RUN") } }, select: { id: true } }).then(found),
    db.endUser
      .findMany({ where: { id: { in: rows.filter((r) => r.endUserId).map((r) => r.endUserId!) } }, select: { id: true } })
      .then(found),
  ]);
  const byKind: Record<string, Set<string>> = { SUMMARY_REVISION: revisions, TURN: turns, EVENT: events, JOB_RUN: runs };
  return (row: { kind: string; refId: string | null; endUserId: string | null }) =>
    (!byKind[row.kind] || byKind[row.kind].has(row.refId ?? "")) &&
    (!(row.kind === "FACT" || row.kind === "RECALL") || users.has(row.endUserId ?? ""));
}

type ActivityRow = Awaited<ReturnType<TenantDb["activityLog"]["findMany"]>>[number];

async function itemsOf(db: TenantDb, rows: ActivityRow[]): Promise<FeedPayload[]> {
  const snippetIds = rows.flatMap((r) => (r.kind === "RECALL" ? (r.detail as RecallDetail).candidates.map((c) => c.snippetId) : []));
  const snippets = new Map(
    (await db.recallSnippet.findMany({ where: { id: { in: snippetIds } }, select: { id: true, text: true, occurredAt: true } })).map((s) => [s.id, s]),
  );
  return rows.map((row): FeedPayload => {
    const base = { key: row.id, at: row.at };
    const conversationId = row.conversationId ?? "";
    switch (row.kind as FeedKind) {
      case "SUMMARY_REVISION":
        return { ...base, kind: "SUMMARY_REVISION", ref: { conversationId, revisionId: row.refId! } };
      case "TURN":
        return { ...base, kind: "TURN", ref: { turnId: row.refId!, agentId: row.agentId ?? "", conversationId } };
      case "EVENT":
        return { ...base, kind: "EVENT", ref: { id: row.refId!, scope: row.scope ?? "", scopeRef: row.scopeRef ?? "" } };
      case "ENTRY":
        return { ...base, kind: "ENTRY", ref: { id: row.refId!, scope: row.scope ?? "", scopeRef: row.scopeRef ?? "", change: row.change as never } };
      case "JOB_RUN":
        return { ...base, kind: "JOB_RUN", ref: { id: row.refId! } };
      case "FACT":
        return {
          ...base,
          kind: "FACT",
          ref: { endUserId: row.endUserId!, factId: row.refId, change: row.change as never, reason: "", text: null, conversationId: row.conversationId },
        };
      case "RECALL": {
        const detail = row.detail as RecallDetail;
        // A candidate whose snippet was forgotten is left out with its text.
        const candidates = detail.candidates.flatMap((c) => {
          const snippet = snippets.get(c.snippetId);
          return snippet ? [{ ...c, text: snippet.text, occurredAt: snippet.occurredAt }] : [];
        });
        return {
          ...base,
          kind: "RECALL",
          ref: { id: row.refId!, endUserId: row.endUserId!, conversationId: row.conversationId, message: "", at: row.at, candidates, chosenBy: detail.chosenBy, degraded: detail.degraded },
        };
      }
    }
  });
}

/** One page of the feed's history, newest first, filtered as the live feed is, plus kinds and a time range. */
export async function feedHistory(db: TenantDb, args: HistoryArgs) {
  const first = Math.min(Math.max(args.first, 1), 200);
  let before: Prisma.ActivityLogWhereInput = {};
  if (args.after != null) {
    const last = readCursor(args.after);
    before = { OR: [{ at: { lt: last.at } }, { at: last.at, id: { lt: last.id } }] };
  }
  const where: Prisma.ActivityLogWhereInput = {
    AND: [
      await filterWhere(db, args),
      before,
      args.kinds?.length ? { kind: { in: args.kinds } } : {},
      args.since || args.until ? { at: { ...(args.since && { gte: args.since }), ...(args.until && { lte: args.until }) } } : {},
    ],
  };
  const rows = await db.activityLog.findMany({ where, orderBy: [{ at: "desc" }, { id: "desc" }], take: first + 1 });
  const page = rows.slice(0, first);
  const keep = await readable(db, page);
  return {
    items: await itemsOf(db, page.filter(keep)),
    // The cursor is the page's last row, read or not, so a dropped row never stalls paging.
    endCursor: page.length ? cursorOf(page.at(-1)!) : null,
    hasMore: rows.length > first,
  };
}

/** A forgotten user's history rows: their conversations', their facts' and recalls', and the events and entries about them as an entity. */
export async function forgetActivity(db: TenantDb, endUserId: string, conversationIds: string[], externalId: string) {
  const { count } = await db.activityLog.deleteMany({
    where: {
      OR: [
        { endUserId },
        { conversationId: { in: conversationIds } },
        { kind: { in: ["EVENT", "ENTRY"] }, ...aboutThePerson(externalId) },
      ],
    },
  });
  return count;
}
