import { filter, map, pipe, Repeater } from "graphql-yoga";
import { builder, type GraphQLContext } from "../builder.ts";
import { contextTimeline, type TimelinePoint } from "../memory/conversations/timeline.ts";
import { FEED_KINDS, feedHistory, type FeedKind as HistoryKind } from "../memory/activity.ts";
import { feedMatcher, type FeedPayload, type Payload } from "../memory/feed-filter.ts";
import type { EntryChange, Topics } from "../pubsub.ts";
import { EntryChangeKindEnum } from "./entries.ts";
import { ScopeEnum } from "./enums.ts";
import { FactChangeKindEnum } from "./facts.ts";
import { RecallEventRef } from "./recall.ts";

/**
 * The inspector's live feed: every pubsub topic merged into one stream of items that carry ids;
 * each item's fields re-read through the tenant-scoped client, so the feed shows what a query
 * would return.
 */
type FeedKind = FeedPayload["kind"];
type ItemOf<K extends FeedKind> = Extract<FeedPayload, { kind: K }>;

const FeedItem = builder.interfaceRef<FeedPayload>("FeedItem").implement({
  description: "Something memory did, as the live feed shows it.",
  resolveType: (item) => FEED_TYPES[item.kind],
  fields: (t) => ({
    id: t.exposeID("key", { description: "Unique per occurrence." }),
    at: t.field({ type: "DateTime", description: "When it was announced.", resolve: (item) => item.at }),
  }),
});

const SummaryRevisionItem = builder.objectRef<ItemOf<"SUMMARY_REVISION">>("SummaryRevisionFeedItem").implement({
  description: "A summary rewrite, accepted or rejected with the loss judge's reason.",
  interfaces: [FeedItem],
  fields: (t) => ({
    revision: t.prismaField({
      type: "SummaryRevision",
      resolve: (query, item, _args, ctx) =>
        ctx.db.summaryRevision.findUniqueOrThrow({ ...query, where: { id: item.ref.revisionId } }),
    }),
    conversation: t.prismaField({
      type: "Conversation",
      resolve: (query, item, _args, ctx) =>
        ctx.db.conversation.findUniqueOrThrow({ ...query, where: { id: item.ref.conversationId } }),
    }),
  }),
});

const TurnItem = builder.objectRef<ItemOf<"TURN">>("TurnFeedItem").implement({
  description: "A turn recorded.",
  interfaces: [FeedItem],
  fields: (t) => ({
    turn: t.prismaField({
      type: "Turn",
      resolve: (query, item, _args, ctx) =>
        ctx.db.turn.findUniqueOrThrow({ ...query, where: { id: item.ref.turnId } }),
    }),
  }),
});

const EventItem = builder.objectRef<ItemOf<"EVENT">>("EventFeedItem").implement({
  description: "An event appended to the log.",
  interfaces: [FeedItem],
  fields: (t) => ({
    event: t.prismaField({
      type: "MemoryEvent",
      resolve: (query, item, _args, ctx) =>
        ctx.db.memoryEvent.findUniqueOrThrow({ ...query, where: { id: item.ref.id } }),
    }),
  }),
});

const EntryItem = builder.objectRef<ItemOf<"ENTRY">>("EntryFeedItem").implement({
  description: "An entry created, corrected or forgotten.",
  interfaces: [FeedItem],
  fields: (t) => ({
    change: t.field({ type: EntryChangeKindEnum, resolve: (item) => item.ref.change }),
    entryId: t.id({ resolve: (item) => item.ref.id }),
    scope: t.field({ type: ScopeEnum, resolve: (item) => item.ref.scope as never }),
    scopeRef: t.string({ resolve: (item) => item.ref.scopeRef }),
    entry: t.prismaField({
      type: "MemoryEntry",
      nullable: true,
      description: "The entry as it is now; null once forgotten.",
      resolve: (query, item, _args, ctx) =>
        ctx.db.memoryEntry.findUnique({ ...query, where: { id: item.ref.id } }),
    }),
  }),
});

const JobRunItem = builder.objectRef<ItemOf<"JOB_RUN">>("JobRunFeedItem").implement({
  description: "A background job run starting or finishing.",
  interfaces: [FeedItem],
  fields: (t) => ({
    run: t.prismaField({
      type: "JobRun",
      resolve: (query, item, _args, ctx) =>
        ctx.db.jobRun.findUniqueOrThrow({ ...query, where: { id: item.ref.id } }),
    }),
  }),
});

const FactItem = builder.objectRef<ItemOf<"FACT">>("FactFeedItem").implement({
  description: "A user fact added, refreshed, updated, corrected, deleted or forgotten.",
  interfaces: [FeedItem],
  fields: (t) => ({
    change: t.field({ type: FactChangeKindEnum, resolve: (item) => item.ref.change }),
    factId: t.id({ nullable: true, resolve: (item) => item.ref.factId }),
    fact: t.prismaField({
      type: "Fact",
      nullable: true,
      description: "The fact as it is now; null once deleted or forgotten.",
      resolve: (query, item, _args, ctx) =>
        item.ref.factId ? ctx.db.fact.findUnique({ ...query, where: { id: item.ref.factId } }) : null,
    }),
    endUser: t.prismaField({
      type: "EndUser",
      resolve: (query, item, _args, ctx) =>
        ctx.db.endUser.findUniqueOrThrow({ ...query, where: { id: item.ref.endUserId } }),
    }),
    conversationId: t.id({ nullable: true, resolve: (item) => item.ref.conversationId }),
    text: t.string({ nullable: true, description: "The fact's text (kept for deleted facts).", resolve: (item) => item.ref.text }),
    reason: t.string({ resolve: (item) => item.ref.reason }),
  }),
});

const RecallItem = builder.objectRef<ItemOf<"RECALL">>("RecallFeedItem").implement({
  description: "A recall on a turn: the message, the candidates with their scores, and what was chosen.",
  interfaces: [FeedItem],
  fields: (t) => ({
    // Recalls are not stored: the announcement is the whole record.
    recall: t.field({ type: RecallEventRef, resolve: (item) => item.ref }),
    endUser: t.prismaField({
      type: "EndUser",
      resolve: (query, item, _args, ctx) =>
        ctx.db.endUser.findUniqueOrThrow({ ...query, where: { id: item.ref.endUserId } }),
    }),
  }),
});

const FEED_TYPES: Record<FeedKind, string> = {
  SUMMARY_REVISION: SummaryRevisionItem.name,
  TURN: TurnItem.name,
  EVENT: EventItem.name,
  ENTRY: EntryItem.name,
  JOB_RUN: JobRunItem.name,
  FACT: FactItem.name,
  RECALL: RecallItem.name,
};

/** One topic of the tenant's pubsub as feed items. */
function topic<T extends keyof Topics>(ctx: GraphQLContext, name: T, kind: FeedKind, keyOf: (ref: Payload<T>) => string) {
  return pipe(
    // The generic topic name defeats pubsub's tuple typing; every topic is keyed by tenant id.
    (ctx.deps.pubsub.subscribe as (name: T, tenantId: string) => AsyncIterable<Payload<T>>)(
      name,
      ctx.principal.tenantId,
    ),
    map((ref: Payload<T>) => {
      // The history row's id and time when it was recorded, so a live item and its history row are one item.
      const { activityId, activityAt } = ref as { activityId?: string; activityAt?: string };
      const at = activityAt ? new Date(activityAt) : new Date();
      return { kind, ref, at, key: activityId ?? `${kind}:${keyOf(ref)}:${at.getTime()}` } as FeedPayload;
    }),
  );
}

builder.subscriptionFields((t) => ({
  memoryFeed: t.field({
    type: FeedItem,
    authScopes: { reader: true },
    description:
      "Everything memory does, as it happens: turns, summary rewrites, recalls, fact changes, events, entry changes " +
      "and job runs. " +
      "Filtered by agent, user and conversation when given (job runs only show unfiltered).",
    args: { agentId: t.arg.id(), endUserId: t.arg.id(), conversationId: t.arg.id() },
    subscribe: async (_root, args, ctx) => {
      const matches = await feedMatcher(ctx.db, {
        agentId: args.agentId ? String(args.agentId) : undefined,
        endUserId: args.endUserId ? String(args.endUserId) : undefined,
        conversationId: args.conversationId ? String(args.conversationId) : undefined,
      });
      return pipe(
        Repeater.merge([
          topic(ctx, "summaryChanged", "SUMMARY_REVISION", (ref) => ref.revisionId),
          topic(ctx, "turnRecorded", "TURN", (ref) => ref.turnId),
          topic(ctx, "eventAppended", "EVENT", (ref) => ref.id),
          topic(ctx, "entryChanged", "ENTRY", (ref) => `${ref.id}:${ref.change satisfies EntryChange}`),
          topic(ctx, "jobRunChanged", "JOB_RUN", (ref) => ref.id),
          topic(ctx, "factChanged", "FACT", (ref) => `${ref.factId ?? ref.endUserId}:${ref.change}`),
          topic(ctx, "memoryRecall", "RECALL", (ref) => ref.id),
        ]),
        filter(matches),
      );
    },
    resolve: (item) => item,
  }),
}));

const TimelinePointRef = builder.objectRef<TimelinePoint>("ContextTimelinePoint").implement({
  description: "What the conversation's own blocks cost after one turn, against sending the history whole.",
  fields: (t) => ({
    turnId: t.exposeID("turnId"),
    seq: t.exposeInt("seq", { description: "The turn's last message." }),
    occurredAt: t.expose("occurredAt", { type: "DateTime" }),
    sentTokens: t.exposeInt("sentTokens", { description: "Summary, kept messages and tail." }),
    baselineTokens: t.exposeInt("baselineTokens", { description: "The last history-size messages whole." }),
    summaryTokens: t.exposeInt("summaryTokens"),
  }),
});

builder.queryFields((t) => ({
  contextTimeline: t.field({
    type: [TimelinePointRef],
    authScopes: { reader: true },
    description:
      "Tokens sent against the baseline after each of the conversation's last 200 turns, recomputed from " +
      "stored messages and accepted revisions (facts, entries and recall are left out: they depend on the next message). " +
      "One per request (QUERY_TOO_COMPLEX beyond).",
    args: { conversationId: t.arg.id({ required: true }) },
    resolve: (_root, { conversationId }, ctx) => contextTimeline(ctx.db, String(conversationId)),
  }),
}));

const FeedKindEnum = builder.enumType("FeedKind", {
  description: "The kinds of item the feed shows.",
  values: FEED_KINDS satisfies HistoryKind[],
});

const FeedPage = builder
  .objectRef<{ items: FeedPayload[]; endCursor: string | null; hasMore: boolean }>("FeedPage")
  .implement({
    description: "One page of the feed's history, newest first.",
    fields: (t) => ({
      items: t.field({ type: [FeedItem], resolve: (page) => page.items }),
      endCursor: t.exposeString("endCursor", {
        nullable: true,
        description: "Pass as `after` for the next (older) page. Opaque; it holds its place when its item is gone (a job run moved on, a forget).",
      }),
      hasMore: t.exposeBoolean("hasMore"),
    }),
  });

builder.queryFields((t) => ({
  memoryFeed: t.field({
    type: FeedPage,
    authScopes: { reader: true },
    description:
      "The feed's history, newest first: what the memoryFeed subscription announced, from a durable activity log of ids " +
      "and kinds (items re-read their rows; what was forgotten is gone). Filtered as the subscription is, and by kinds " +
      "and a time range. Job runs show one item each, in their latest state.",
    args: {
      agentId: t.arg.id(),
      endUserId: t.arg.id(),
      conversationId: t.arg.id(),
      kinds: t.arg({ type: [FeedKindEnum] }),
      since: t.arg({ type: "DateTime" }),
      until: t.arg({ type: "DateTime" }),
      first: t.arg.int({ defaultValue: 50, description: "At most 200." }),
      after: t.arg.string({ description: "The endCursor of the page before." }),
    },
    resolve: (_root, args, ctx) =>
      feedHistory(ctx.db, {
        agentId: args.agentId ? String(args.agentId) : undefined,
        endUserId: args.endUserId ? String(args.endUserId) : undefined,
        conversationId: args.conversationId ? String(args.conversationId) : undefined,
        kinds: args.kinds,
        since: args.since,
        until: args.until,
        first: args.first ?? 50,
        after: args.after,
      }),
  }),
}));
