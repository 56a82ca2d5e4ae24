import pg from "pg";
import { percentile } from "../../bench/lib.ts";
import { until } from "./until.ts";

// Write load as agents make it, from a bounded set of concurrent clients over HTTP on loopback,
// and the checks that follow a fault or a soak: every acknowledged write is stored exactly once,
// sequence numbers are gapless, and every turn's follow-ups (snippets, summary, extraction) ran.

export type Operation = "recordTurn" | "appendEvent" | "context" | "searchEntries" | "recall";

export type AckedTurn = { clientTurnId: string; turnId: string; conversationExternalId: string; firstSeq: number; lastSeq: number };
export type AckedEvent = { sourceRef: string; eventId: string };

export type OperationStats = { count: number; errors: number; timeouts: number; latencies: number[]; errorSamples: string[] };

export type LoadOptions = {
  /** The server's base URL (http://127.0.0.1:port). */
  url: string;
  key: string;
  clients: number;
  /** Conversations the clients spread over (client i writes to conversation i % conversations). */
  conversations: number;
  /** Names of this load's conversations, turns and events, so two loads never collide. */
  tag: string;
  /** Relative weights of the operations each client picks from; default writes only, 2:1. */
  mix?: Partial<Record<Operation, number>>;
  /** A request not answered in this time counts as a timeout (default 30 s). */
  timeoutMs?: number;
  /** A failed write is tried again with the same id (a retry is safe), up to this many times. */
  retries?: number;
};

export type WriteLoad = {
  acked: { turns: AckedTurn[]; events: AckedEvent[] };
  stats: Record<Operation, OperationStats>;
  /** Resolves once at least n writes were acknowledged. */
  untilAcked(n: number, timeoutMs?: number): Promise<void>;
  /** Lets every client finish its request in flight, then stops. */
  stop(): Promise<void>;
};

const RECORD_TURN = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id clientTurnId firstSeq lastSeq conversation { id endUser { id } } } }`;
const APPEND_EVENT = `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id sourceRef } }`;
const CONTEXT = `query($input: ContextInput!) { context(input: $input) { totalTokens blocks { kind tokens } } }`;
const SEARCH = `query($search: String!) { entries(search: $search, first: 10) { edges { node { id } } } }`;
const RECALL = `query($input: RecallInput!) { recall(input: $input) { candidates { snippetId } } }`;

/** An agent's end user for a conversation: a few conversations per user, so recall has others to search. */
export const userOf = (tag: string, conversation: number) => `${tag}-u${Math.floor(conversation / 3)}`;

class Timeout extends Error {}

async function call(url: string, key: string, query: string, variables: Record<string, unknown>, timeoutMs: number) {
  let response: Response;
  try {
    response = await fetch(`${url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ query, variables }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const body = (await response.json()) as { data?: any; errors?: { message: string; extensions?: { code?: string } }[] };
    if (body.errors?.length) {
      const [first] = body.errors;
      throw new Error(`${first.extensions?.code ?? "NO_CODE"}: ${first.message}`.slice(0, 200));
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    return body.data;
  } catch (error) {
    if ((error as Error).name === "TimeoutError") throw new Timeout(`no answer in ${timeoutMs} ms`);
    throw error;
  }
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export function startWriteLoad(options: LoadOptions): WriteLoad {
  const { url, key, clients, conversations, tag } = options;
  const timeoutMs = options.timeoutMs ?? 30_000;
  const retries = options.retries ?? 3;
  const mix = Object.entries(options.mix ?? { recordTurn: 2, appendEvent: 1 }).filter(([, w]) => w! > 0) as [Operation, number][];
  const totalWeight = mix.reduce((sum, [, w]) => sum + w, 0);
  const stats = Object.fromEntries(
    (["recordTurn", "appendEvent", "context", "searchEntries", "recall"] as Operation[]).map((op) => [
      op,
      { count: 0, errors: 0, timeouts: 0, latencies: [], errorSamples: [] } as OperationStats,
    ]),
  ) as unknown as Record<Operation, OperationStats>;
  const acked = { turns: [] as AckedTurn[], events: [] as AckedEvent[] };
  const endUserIds: string[] = [];
  let running = true;
  let serial = 0;

  const measured = async <T>(op: Operation, work: () => Promise<T>): Promise<T | undefined> => {
    const started = performance.now();
    try {
      const result = await work();
      stats[op].count++;
      stats[op].latencies.push(performance.now() - started);
      return result;
    } catch (error) {
      stats[op].count++;
      if (error instanceof Timeout) stats[op].timeouts++;
      else stats[op].errors++;
      if (stats[op].errorSamples.length < 5) stats[op].errorSamples.push(String((error as Error).message));
      return undefined;
    }
  };

  /** A write tried until acknowledged or out of retries; the same id each time, as a careful agent retries. */
  const write = async <T>(op: Operation, work: () => Promise<T>): Promise<T | undefined> => {
    for (let attempt = 0; attempt <= retries && running; attempt++) {
      const result = await measured(op, work);
      if (result !== undefined) return result;
      await pause(250 * (attempt + 1));
    }
    return undefined;
  };

  const pick = (): Operation => {
    let roll = Math.random() * totalWeight;
    for (const [op, weight] of mix) if ((roll -= weight) < 0) return op;
    return mix[0][0];
  };

  const client = async (index: number) => {
    const conversation = index % conversations;
    const participants = {
      agentExternalId: `${tag}-agent`,
      endUserExternalId: userOf(tag, conversation),
      conversationExternalId: `${tag}-c${conversation}`,
    };
    while (running) {
      const n = ++serial;
      const op = pick();
      if (op === "recordTurn") {
        const input = {
          ...participants,
          clientTurnId: `${tag}-t${n}`,
          userMessage: `Turn ${n}: please book the usual table for ${n % 7} people, near the window.`,
          assistantMessage: `Booked for ${n % 7}.`,
        };
        const data = await write(op, () => call(url, key, RECORD_TURN, { input }, timeoutMs));
        if (data) {
          const turn = data.recordTurn;
          acked.turns.push({ clientTurnId: input.clientTurnId, turnId: turn.id, conversationExternalId: input.conversationExternalId, firstSeq: turn.firstSeq, lastSeq: turn.lastSeq });
          if (endUserIds.length < 50 && !endUserIds.includes(turn.conversation.endUser.id)) endUserIds.push(turn.conversation.endUser.id);
        }
      } else if (op === "appendEvent") {
        const input = {
          scope: "ENTITY",
          scopeRef: `${tag}-customer-${n % 20}`,
          kind: "call_summary",
          body: `Call ${n}: the customer moved the renewal to March; budget confirmed.`,
          source: "load",
          sourceRef: `${tag}-ev${n}`,
        };
        const data = await write(op, () => call(url, key, APPEND_EVENT, { input }, timeoutMs));
        if (data) acked.events.push({ sourceRef: input.sourceRef, eventId: data.appendEvent.id });
      } else if (op === "context") {
        await measured(op, () => call(url, key, CONTEXT, { input: { ...participants, message: "Same as last time, please." } }, timeoutMs));
      } else if (op === "searchEntries") {
        await measured(op, () => call(url, key, SEARCH, { search: "renewal" }, timeoutMs));
      } else if (op === "recall") {
        const endUserId = endUserIds[n % Math.max(1, endUserIds.length)];
        if (endUserId) await measured(op, () => call(url, key, RECALL, { input: { endUserId, text: "the usual table near the window" } }, timeoutMs));
        else await pause(50);
      }
    }
  };

  const lanes = Array.from({ length: clients }, (_, i) => client(i));
  return {
    acked,
    stats,
    untilAcked: (n, ms = 120_000) => until(`${n} acknowledged writes`, async () => acked.turns.length + acked.events.length >= n, ms).then(() => {}),
    async stop() {
      running = false;
      await Promise.all(lanes);
    },
  };
}

/** p50 / p95 / p99 of an operation's answered requests, in ms. */
export function latencyOf(stats: OperationStats) {
  const sorted = [...stats.latencies].sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p95: percentile(sorted, 95), p99: percentile(sorted, 99) };
}

async function withClient<T>(storeUrl: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  // A check never hangs on a wedged store: it fails, and untilFollowUpsDone asks again.
  const client = new pg.Client({ connectionString: storeUrl, connectionTimeoutMillis: 10_000, query_timeout: 60_000 } as pg.ClientConfig);
  client.on("error", () => {});
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * What is wrong with the acknowledged writes in the store (an empty list when nothing is): a
 * write missing or stored twice, a turn whose messages are not where it was told, a
 * conversation whose sequence numbers have a gap or a doubled number.
 */
export function verifyAcknowledged(storeUrl: string, tenantId: string, acked: WriteLoad["acked"]): Promise<string[]> {
  return withClient(storeUrl, async (client) => {
    const problems: string[] = [];
    const turnIds = acked.turns.map((t) => t.clientTurnId);
    const { rows: turns } = await client.query<{ clientTurnId: string; id: string; firstSeq: number; lastSeq: number; n: number }>(
      `SELECT t."clientTurnId", min(t."id") AS id, min(t."firstSeq") AS "firstSeq", max(t."lastSeq") AS "lastSeq", count(*)::int AS n,
              (SELECT count(*)::int FROM "Message" m WHERE m."conversationId" = min(t."conversationId") AND m."seq" BETWEEN min(t."firstSeq") AND max(t."lastSeq")) AS messages
       FROM "Turn" t WHERE t."tenantId" = $1 AND t."clientTurnId" = ANY($2) GROUP BY t."clientTurnId"`,
      [tenantId, turnIds],
    );
    const stored = new Map(turns.map((t) => [t.clientTurnId, t]));
    for (const turn of acked.turns) {
      const row = stored.get(turn.clientTurnId) as (typeof turns)[number] & { messages: number } | undefined;
      if (!row) problems.push(`turn ${turn.clientTurnId} was acknowledged but is missing`);
      else if (row.n !== 1) problems.push(`turn ${turn.clientTurnId} is stored ${row.n} times`);
      else if (row.id !== turn.turnId || row.firstSeq !== turn.firstSeq || row.lastSeq !== turn.lastSeq)
        problems.push(`turn ${turn.clientTurnId} differs from what was acknowledged`);
      else if (row.messages !== turn.lastSeq - turn.firstSeq + 1) problems.push(`turn ${turn.clientTurnId} has ${row.messages} of its messages`);
    }
    const { rows: events } = await client.query<{ sourceRef: string; id: string; n: number }>(
      `SELECT "sourceRef", min("id") AS id, count(*)::int AS n FROM "MemoryEvent"
       WHERE "tenantId" = $1 AND "source" = 'load' AND "sourceRef" = ANY($2) GROUP BY "sourceRef"`,
      [tenantId, acked.events.map((e) => e.sourceRef)],
    );
    const storedEvents = new Map(events.map((e) => [e.sourceRef, e]));
    for (const event of acked.events) {
      const row = storedEvents.get(event.sourceRef);
      if (!row) problems.push(`event ${event.sourceRef} was acknowledged but is missing`);
      else if (row.n !== 1) problems.push(`event ${event.sourceRef} is stored ${row.n} times`);
      else if (row.id !== event.eventId) problems.push(`event ${event.sourceRef} differs from what was acknowledged`);
    }
    // Gapless: messages 1..lastSeq, each number once, and the turns' ranges tile them.
    const { rows: gaps } = await client.query<{ externalId: string; lastSeq: number; messages: number; distinct: number; top: number | null; covered: number }>(
      `SELECT c."externalId", c."lastSeq",
              (SELECT count(*)::int FROM "Message" m WHERE m."conversationId" = c."id") AS messages,
              (SELECT count(DISTINCT m."seq")::int FROM "Message" m WHERE m."conversationId" = c."id") AS "distinct",
              (SELECT max(m."seq") FROM "Message" m WHERE m."conversationId" = c."id") AS top,
              (SELECT coalesce(sum(t."lastSeq" - t."firstSeq" + 1), 0)::int FROM "Turn" t WHERE t."conversationId" = c."id") AS covered
       FROM "Conversation" c WHERE c."tenantId" = $1`,
      [tenantId],
    );
    for (const c of gaps) {
      if (c.messages !== c.lastSeq || c.distinct !== c.lastSeq || (c.top ?? 0) !== c.lastSeq || c.covered !== c.lastSeq)
        problems.push(`conversation ${c.externalId}: lastSeq ${c.lastSeq}, ${c.messages} messages, ${c.distinct} distinct numbers up to ${c.top}, ${c.covered} covered by turns`);
    }
    return problems;
  });
}

export type FollowUps = {
  /** Turns whose follow-ups were never queued (the outbox). */
  notDispatched: number;
  /** Shared messages of turns that are in no TURN snippet. */
  withoutSnippet: number;
  /** Snippets without their vector. */
  notIndexed: number;
  /** Conversations whose summary lags behind by more than their tail. */
  summaryBehind: number;
  /** Conversations with shared messages the extractor has not read. */
  extractionBehind: number;
  /** Turns whose user message the gate has not judged (Turn.gatedAt). */
  notJudged: number;
};

/** What is still to do of the tenant's turns' follow-ups (all zero when everything ran). */
export function followUpsPending(storeUrl: string, tenantId: string, options: { tailSize?: number } = {}): Promise<FollowUps> {
  const tail = options.tailSize ?? 6;
  return withClient(storeUrl, async (client) => {
    const { rows } = await client.query<FollowUps>(
      `SELECT
         (SELECT count(*)::int FROM "Turn" WHERE "tenantId" = $1 AND "followUpsQueuedAt" IS NULL) AS "notDispatched",
         (SELECT count(*)::int FROM "Message" m
           WHERE m."tenantId" = $1 AND NOT m."private"
             AND m."id" NOT IN (SELECT unnest(s."messageIds") FROM "RecallSnippet" s WHERE s."tenantId" = $1 AND s."kind" = 'TURN')) AS "withoutSnippet",
         (SELECT count(*)::int FROM "RecallSnippet" WHERE "tenantId" = $1 AND "indexedAt" IS NULL) AS "notIndexed",
         (SELECT count(*)::int FROM "Conversation" c WHERE c."tenantId" = $1
             AND (SELECT count(*) FROM "Message" m WHERE m."conversationId" = c."id" AND NOT m."private" AND m."seq" > c."summaryThroughSeq") > $2) AS "summaryBehind",
         (SELECT count(*)::int FROM "Conversation" c WHERE c."tenantId" = $1
             AND EXISTS (SELECT 1 FROM "Message" m WHERE m."conversationId" = c."id" AND NOT m."private" AND m."seq" > c."extractedThroughSeq")) AS "extractionBehind",
         (SELECT count(*)::int FROM "Turn" WHERE "tenantId" = $1 AND "gatedAt" IS NULL AND "clientTurnId" NOT LIKE 'import:%') AS "notJudged"`,
      [tenantId, tail],
    );
    return rows[0];
  });
}

/** Waits until every follow-up of the tenant's turns ran; fails saying what is still to do. */
export async function untilFollowUpsDone(storeUrl: string, tenantId: string, timeoutMs: number, options: { tailSize?: number } = {}) {
  let last: FollowUps | undefined;
  try {
    await until(
      "every turn's follow-ups",
      async () => {
        last = await followUpsPending(storeUrl, tenantId, options).catch(() => undefined);
        return last && Object.values(last).every((n) => n === 0);
      },
      timeoutMs,
    );
  } catch (error) {
    throw new Error(`${(error as Error).message}; still to do: ${JSON.stringify(last)}`);
  }
}
