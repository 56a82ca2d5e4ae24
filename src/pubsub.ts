import { createPubSub, Repeater } from "graphql-yoga";
import { Redis } from "ioredis";
import { EngramError } from "./errors.ts";
import type { SnippetKind } from "./generated/prisma/client.ts";
import type { Logger } from "./log.ts";
import { withTimeout } from "./timeout.ts";

/**
 * Every topic is keyed by tenant id, so a subscriber can only ever hear its own tenant.
 * Payloads carry ids; subscription fields re-read rows through the tenant-scoped client.
 */
export type Topics = {
  eventAppended: [tenantId: string, payload: { id: string; scope: string; scopeRef: string }];
  entryChanged: [
    tenantId: string,
    payload: { id: string; scope: string; scopeRef: string; change: EntryChange; entry?: unknown },
  ];
  jobRunChanged: [tenantId: string, payload: { id: string }];
  summaryChanged: [tenantId: string, payload: { conversationId: string; revisionId: string }];
  turnRecorded: [tenantId: string, payload: { turnId: string; agentId: string; conversationId: string }];
  /** A recall is not stored: its payload is the whole record (candidates, scores, chosen). */
  memoryRecall: [tenantId: string, payload: RecallEvent];
  factChanged: [tenantId: string, payload: FactChangePayload];
  /** Not per tenant: every instance closes the revoked key's sockets. */
  apiKeyRevoked: [channel: "all", payload: { apiKeyId: string }];
  /**
   * Not per tenant: another instance (`origin`) changed a tenant's vectors in Chroma, so every
   * instance brings its copies of them up to date (vectors/cache.ts): the ids of new vectors, to
   * read, and deletes, as the selector they were made with (ids, not content).
   */
  vectorsChanged: [
    channel: "all",
    payload: {
      origin: string;
      tenantId: string;
      upserted?: { model: string; endUserIds: string[]; ids: string[] };
      deleted?: { ids?: string[]; endUserId?: string; conversationId?: string; occurredBefore?: string };
    },
  ];
};

/** One recall candidate as the inspector shows it: its scores from each retriever and the judge. */
export type RecallCandidate = {
  snippetId: string;
  kind: SnippetKind;
  text: string;
  conversationId: string;
  messageIds: string[];
  /** The sequence numbers of messageIds in their conversation, in the same order. */
  messageSeqs: number[];
  occurredAt: Date;
  /** When its vector reached the vector store; null while it waits (found by keywords only). */
  indexedAt: Date | null;
  /** Cosine similarity to the message, and rank among the vector hits (from 1). */
  vectorScore: number | null;
  vectorRank: number | null;
  /** Okapi BM25 score of the full-text match (over the user's snippets), and rank among the keyword hits. */
  keywordScore: number | null;
  keywordRank: number | null;
  /** Reciprocal rank fusion of the two ranks (the keyword side weighted, RECALL), plus the time boost. */
  fusedScore: number;
  /** In the time the message names ("in May", "last Tuesday", "the last time"). */
  timeMatch: boolean;
  /** The re-rank judge's 0–3, when it ran. */
  judgeScore: number | null;
  chosen: boolean;
};

/** A recall as it happened: the candidates, how they were chosen, and why vector search was skipped. */
export type RecallEvent = {
  id: string;
  endUserId: string;
  conversationId: string | null;
  message: string;
  at: Date;
  candidates: RecallCandidate[];
  /** "JUDGE" when the re-ranker chose, "FLOOR" when the similarity floor did (no model). */
  chosenBy: "JUDGE" | "FLOOR";
  /** Why vector search was skipped (Chroma or the embedder down), when it was. */
  degraded: string | null;
  /** Why the re-rank judge's choice is not the one made (its model failed), when it is not. */
  judgeDegraded?: string | null;
};

export type EntryChange = "CREATED" | "CORRECTED" | "FORGOTTEN";

export type FactChangeKind = "ADDED" | "REFRESHED" | "UPDATED" | "CONTRADICTED" | "CORRECTED" | "RESOLVED" | "DELETED" | "FORGOTTEN";

/** A fact change; `text` is kept so a deleted fact can still be shown in the live record. */
export type FactChangePayload = {
  endUserId: string;
  factId: string | null;
  change: FactChangeKind;
  reason: string;
  text: string | null;
  conversationId: string | null;
};

export type PubSub = ReturnType<typeof createPubSub<Topics>> & {
  close(): Promise<void>;
  /** "local" without Redis; with Redis, "redis" while it answers, else "degraded". */
  mode(): "local" | "redis" | "degraded";
  /**
   * Asks Redis for an answer now (a connection can stay open to a Redis that answers nothing):
   * "answers", "silent" (connected, no answer) or "unreachable"; "answers" without Redis.
   */
  probe(): Promise<RedisProbe>;
  /** Resolves once every announcement made so far has been passed on (a recording wrapper may hold them briefly). */
  settled(): Promise<void>;
};

export type RedisProbe = "answers" | "silent" | "unreachable";

type Listener = EventListenerOrEventListenerObject;
type Quiet = Pick<Logger, "warn" | "info">;

/**
 * An event target over Redis that survives Redis going away: while it is down, events are
 * delivered to this instance's own subscribers (other instances miss them), every Redis call's
 * failure is caught, and channels are subscribed again when it is back. Writes never wait on it.
 */
function resilientRedisEventTarget(publishClient: Redis, subscribeClient: Redis, log: Quiet, stall: RedisStall, prefix: string): EventTarget {
  const listeners = new Map<string, Set<Listener>>();
  const deliver = (topic: string, detail: unknown) => {
    for (const listener of listeners.get(topic) ?? []) {
      const event = new CustomEvent(topic, { detail });
      if (typeof listener === "function") listener(event);
      else listener.handleEvent(event);
    }
  };
  const ignore = (what: string) => (error: unknown) => log.warn(`redis ${what} failed; subscriptions are local until it is back`, { error });

  // Events delivered here because their publish got no answer in time: the publish was sent all
  // the same, and a Redis that answers late passes it on; that copy is not delivered a second time.
  const deliveredLocally = new Map<string, number>();
  const remember = (key: string) => {
    const now = Date.now();
    for (const [old, at] of deliveredLocally) if (now - at > LATE_COPY_MS) deliveredLocally.delete(old);
    deliveredLocally.set(key, now);
  };
  // This instance's publishes still unanswered, and whether Redis has passed them on meanwhile
  // (then a publish that fails after all needs no delivery here).
  const unanswered = new Map<string, boolean>();
  subscribeClient.on("message", (channel: string, message: string) => {
    if (!channel.startsWith(prefix)) return;
    const topic = channel.slice(prefix.length);
    const key = `${topic}\n${message}`;
    if (unanswered.has(key)) unanswered.set(key, true);
    if (deliveredLocally.delete(key)) return;
    deliver(topic, message === "" ? null : JSON.parse(message));
  });
  subscribeClient.on("ready", () => {
    const channels = [...listeners.keys()].map((topic) => prefix + topic);
    if (channels.length) subscribeClient.subscribe(...channels).catch(ignore("subscribe"));
  });
  let down = false;
  for (const client of [publishClient, subscribeClient]) {
    client.on("error", (error: Error) => {
      if (!down) log.warn("redis unavailable; subscriptions are served by this instance alone until it is back", { error: error.message });
      down = true;
    });
    client.on("ready", () => {
      if (down) log.info("redis is back; subscriptions travel through it again");
      down = false;
    });
  }

  return {
    addEventListener(topic: string, callback: EventListenerOrEventListenerObject | null) {
      if (!callback) return;
      let set = listeners.get(topic);
      if (!set) {
        listeners.set(topic, (set = new Set()));
        if (subscribeClient.status === "ready") subscribeClient.subscribe(prefix + topic).catch(ignore("subscribe"));
      }
      set.add(callback);
    },
    removeEventListener(topic: string, callback: EventListenerOrEventListenerObject | null) {
      const set = listeners.get(topic);
      if (!callback || !set) return;
      set.delete(callback);
      if (set.size === 0) {
        listeners.delete(topic);
        if (subscribeClient.status === "ready") subscribeClient.unsubscribe(prefix + topic).catch(ignore("unsubscribe"));
      }
    },
    dispatchEvent(event: Event) {
      const { type, detail } = event as CustomEvent;
      const local = () => deliver(type, detail === undefined ? null : JSON.parse(JSON.stringify(detail)));
      if (publishClient.status !== "ready" || subscribeClient.status !== "ready" || stall.stalled()) {
        local();
        return true;
      }
      const message = detail === undefined ? "" : JSON.stringify(detail);
      const key = `${type}\n${message}`;
      unanswered.set(key, false);
      publishClient.publish(prefix + type, message).then(
        () => unanswered.delete(key),
        (error: unknown) => {
          const passedOn = unanswered.get(key);
          unanswered.delete(key);
          stall.failed(error);
          ignore("publish")(error);
          if (passedOn) return;
          remember(key);
          local();
        },
      );
      return true;
    },
  };
}

/** How long a Redis command may go unanswered before Redis counts as stalled. */
const REDIS_ANSWER_MS = 1_000;
/** How long a stalled Redis is left alone (events go to this instance's subscribers) before it is tried again. */
const REDIS_STALL_MS = 5_000;
/** How often the subscription connection, which sends nothing while no one announces, is asked for an answer. */
const SUBSCRIBER_CHECK_MS = 5_000;
/** How long the late copy of an event delivered here on a failed publish is looked out for. */
const LATE_COPY_MS = 60_000;

/**
 * A Redis whose connection stays open but answers nothing (paused, overloaded, a network that
 * drops packets) looks ready to its client: without a deadline a publish waited for ever and its
 * event reached no one, not even this instance's subscribers, and /healthz said ok. A command
 * unanswered within REDIS_ANSWER_MS marks it stalled for REDIS_STALL_MS.
 */
type RedisStall = { stalled(): boolean; failed(error: unknown): void; cleared(): void };

function redisStall(log: Quiet): RedisStall {
  let until = 0;
  return {
    stalled: () => Date.now() < until,
    failed(error) {
      const message = String((error as Error)?.message ?? error);
      if (!/timed? ?out/i.test(message)) return;
      if (Date.now() >= until) log.warn("redis does not answer; subscriptions are served by this instance alone until it does", { error: message });
      until = Date.now() + REDIS_STALL_MS;
    },
    cleared() {
      until = 0;
    },
  };
}

/** Announcements one subscriber may have waiting (the repeater's own limit is 1,024, past which it throws). */
export const SUBSCRIBER_BACKLOG_MAX = 1_000;

/**
 * yoga's subscribe, with a bound on what waits for a subscriber that reads slower than events
 * come: one more ends that subscription with SUBSCRIBER_TOO_SLOW (after what waits is delivered),
 * where the repeater's overflow was thrown inside publish and brought the whole process down.
 */
function boundedSubscribe(target: EventTarget, log: Quiet): PubSub["subscribe"] {
  return ((routingKey: string, id?: string) => {
    const topic = id === undefined ? routingKey : `${routingKey}:${id}`;
    return new Repeater((push, stop) => {
      let waiting = 0;
      const listener = (event: Event) => {
        if (waiting >= SUBSCRIBER_BACKLOG_MAX) {
          target.removeEventListener(topic, listener);
          log.warn("a subscriber fell too far behind; its subscription is ended", { topic: routingKey, waiting });
          stop(new EngramError("SUBSCRIBER_TOO_SLOW", `This subscription fell ${waiting} events behind and was ended; read what you missed and subscribe again.`));
          return;
        }
        waiting += 1;
        void push((event as CustomEvent).detail).finally(() => (waiting -= 1));
      };
      target.addEventListener(topic, listener);
      void stop.then(() => target.removeEventListener(topic, listener));
    });
  }) as PubSub["subscribe"];
}

/**
 * Redis's channels are the server's, whatever database a client selects: deployments kept apart
 * by the database of their REDIS_URL (redis://cache/2) heard each other's announcements, a
 * recall's whole record included. So the channels of a database other than 0 carry its number
 * (those of database 0 keep their names, so instances of an older Engram still hear them).
 */
function channelPrefix(redisUrl: string): string {
  // As ioredis reads it: the path (redis://cache/2), else a `db` parameter.
  const url = new URL(redisUrl);
  const db = Number(url.pathname.slice(1) || url.searchParams.get("db") || 0);
  return Number.isInteger(db) && db > 0 ? `engram:db${db}:` : "";
}

/** In-process, or through Redis so a mutation on one instance reaches subscribers on another. */
export function createEngramPubSub(redisUrl?: string, log: Quiet = { warn: () => {}, info: () => {} }): PubSub {
  if (!redisUrl) {
    const target = new EventTarget();
    return Object.assign(createPubSub<Topics>({ eventTarget: target }), {
      subscribe: boundedSubscribe(target, log),
      close: async () => {},
      settled: async () => {},
      mode: () => "local" as const,
      probe: async (): Promise<RedisProbe> => "answers",
    });
  }
  // No offline queue: while Redis is down nothing waits on it, and nothing fails late.
  const options = { lazyConnect: false, enableOfflineQueue: false, maxRetriesPerRequest: 1 };
  const publishClient = new Redis(redisUrl, { ...options, commandTimeout: REDIS_ANSWER_MS });
  const subscribeClient = new Redis(redisUrl, options);
  const stall = redisStall(log);
  const target = resilientRedisEventTarget(publishClient, subscribeClient, log, stall, channelPrefix(redisUrl));
  const pubsub = createPubSub<Topics>({ eventTarget: target });
  const ready = () => publishClient.status === "ready" && subscribeClient.status === "ready";
  // A subscription connection dropped without a word in between (a load balancer's or a NAT's
  // idle timeout) looked ready for hours: this instance's subscribers heard nothing, its own
  // events included, and /healthz said ok. Asked for a PING every SUBSCRIBER_CHECK_MS (and by
  // the health check), one that gets no answer within REDIS_ANSWER_MS is connected again (its
  // channels are subscribed again once it is ready; meanwhile events are delivered here).
  const subscriberAnswers = async (): Promise<boolean> => {
    if (subscribeClient.status !== "ready") return false;
    let answered = false;
    const ping = subscribeClient.ping().then(() => (answered = true));
    try {
      await withTimeout(ping, REDIS_ANSWER_MS, "no answer to PING");
      return true;
    } catch (error) {
      // A timer that fired late, after a busy event loop, with the answer waiting to be read: not silent.
      await new Promise((resolve) => setImmediate(resolve));
      if (answered) return true;
      if (subscribeClient.status === "ready") {
        log.warn("redis: the subscription connection does not answer; connecting it again", { error: String((error as Error)?.message ?? error) });
        subscribeClient.disconnect(true);
      }
      return false;
    }
  };
  const watch = setInterval(() => void subscriberAnswers().catch(() => {}), SUBSCRIBER_CHECK_MS);
  watch.unref();
  return Object.assign(pubsub, {
    subscribe: boundedSubscribe(target, log),
    settled: async () => {},
    mode: () => (ready() && !stall.stalled() ? ("redis" as const) : ("degraded" as const)),
    async probe(): Promise<RedisProbe> {
      if (!ready()) return "unreachable";
      try {
        await publishClient.ping();
        stall.cleared();
        return (await subscriberAnswers()) ? "answers" : "silent";
      } catch (error) {
        stall.failed(error);
        return ready() ? "silent" : "unreachable";
      }
    },
    async close() {
      clearInterval(watch);
      // A Redis that does not answer would hold QUIT for ever: closed at once then.
      const quit = (c: Redis) => withTimeout(c.quit(), REDIS_ANSWER_MS, "no answer to QUIT").catch(() => c.disconnect());
      await Promise.allSettled([publishClient, subscribeClient].map((c) => (c.status === "ready" && !stall.stalled() ? quit(c) : c.disconnect())));
    },
  });
}
