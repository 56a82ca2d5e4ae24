import { randomUUID } from "node:crypto";
import type { Logger } from "../log.ts";
import type { PubSub, Topics } from "../pubsub.ts";
import { withTimeout } from "../timeout.ts";
import { collectionName, epoch, vectorVersion } from "./chroma.ts";
import type { SnippetVector, VectorHit, VectorSelector, VectorSpace, VectorStore } from "./index.ts";

/**
 * Recall's vector search filters one collection by end user, and Chroma answers such a filter
 * by walking the whole collection's HNSW graph with the user's ids as allowed labels: about
 * 28 ms at 40,000 vectors for a user holding 1% of them, and more as the collection grows
 * (bench/README.md, "Recall latency"). One user's vectors are few (a thousand is a lot), and an
 * exact scan of them takes well under a millisecond. So each instance keeps a copy of the
 * vectors of the end users it searched recently and answers their searches itself: exact cosine
 * instead of HNSW's approximation, the same hits as Chroma's (or better), without a round trip.
 *
 * Chroma stays the store: every write goes to it first, and the copy is loaded from it.
 * - A user's copy is loaded in the background on their first search, which Chroma answers (at
 *   most 4 loads at once, the others queued, each in pages of ids). Each vector is stored with a
 *   fingerprint of its values and metadata (`vectorVersion`), so a reload lists the user's ids
 *   with theirs and reads again only the vectors that are new or changed (all of them once in
 *   ten TTLs, and always those stored without a fingerprint).
 * - This instance's writes change its copies as they land in Chroma; a write that lands while a
 *   copy is loading is applied again once it has loaded.
 * - A delete is applied to the copies before and after Chroma's, and to any copy that starts
 *   loading in between, so a forgotten snippet is never answered from memory once its forgetting
 *   has started. (Recall reads every hit back from the database too, so a deleted snippet is
 *   never returned in any case.)
 * - Other instances' writes arrive as `vectorsChanged` announcements (through Redis when it is
 *   configured and up): deletes as their selector, applied here too, and new vectors as their
 *   ids, read from Chroma for the users this instance holds a copy of. Without them (no Redis,
 *   Redis down, or a command-line process writing beside the server), a copy older than `ttlMs`
 *   is loaded again, and answers until its replacement has loaded, but not once it is twice that
 *   old (its user was not searched for a while): then Chroma answers (unless it cannot be read
 *   now). That bounds how long another process's new vector goes unseen to twice `ttlMs`.
 * - Copies take at most `maxBytes`, growth included (least recently searched dropped first, but
 *   none searched within `ttlMs`: a user who does not fit is searched in Chroma rather than
 *   thrash the rest, and is tried again after `ttlMs`, then twice, four times... as long, up to
 *   16). A user with more than `maxPerUser` vectors is always searched in Chroma.
 */
export type VectorCacheOptions = {
  maxBytes: number;
  ttlMs: number;
  maxPerUser?: number;
  pubsub: Pick<PubSub, "publish" | "subscribe">;
  log: Logger;
  now?: () => number;
};

type Write = { upsert: SnippetVector[] } | { delete: { tenantId: string; selector: VectorSelector } };

type Copy = {
  key: string;
  tenantId: string;
  collection: string;
  endUserId: string;
  /** Writes that landed while loading, applied again once loaded (null once ready). */
  landed: Write[] | null;
  /** The copy loading to replace this one, once it is older than ttlMs. */
  next?: Copy;
  loadedAt: number;
  /** When the vectors were last all read from Chroma (a reload keeps this unless it reads all again). */
  readWholeAt: number;
  searchedAt: number;
  dims: number;
  size: number;
  ids: string[];
  conversations: string[];
  /** Epoch seconds, as Chroma's metadata has them. */
  occurredAt: number[];
  /** Each row's fingerprint as stored (vectorVersion), undefined for one stored without. */
  versions: (number | undefined)[];
  /** Row i's unit vector at [i * dims, (i + 1) * dims). */
  rows: Float32Array;
  rowOf: Map<string, number>;
};

// How soon a load that failed (Chroma down) is tried again.
const RETRY_MS = 5_000;
// Loads at once: each reads a user's vectors whole (about 6 KB of JSON a 512-d vector).
const MAX_LOADS = 4;
// A load Chroma does not answer within this gives its place up (a hung Chroma would otherwise
// hold the loads' places, and the copies' journals would grow, until it answered).
const LOAD_TIMEOUT_MS = 60_000;
// A reload reads all of a user's vectors again, not only the changed ones, once in this many TTLs.
const WHOLE_READ_EVERY = 10;

type Payload = Topics["vectorsChanged"][1];
// Per row beside its floats: the id and conversation strings, the map entry, the arrays' slots.
const ROW_OVERHEAD_BYTES = 250;
const bytesOf = (copy: Pick<Copy, "size" | "dims" | "rows">) => copy.rows.length * 4 + copy.size * ROW_OVERHEAD_BYTES;

function unit(vector: ArrayLike<number>): Float32Array {
  let norm = 0;
  for (let i = 0; i < vector.length; i++) norm += vector[i] * vector[i];
  norm = Math.sqrt(norm) || 1;
  const out = new Float32Array(vector.length);
  for (let i = 0; i < vector.length; i++) out[i] = vector[i] / norm;
  return out;
}

type Row = { id: string; unit: Float32Array; conversationId: string; occurredAt: number; version: number | undefined };

/** A vector as a row: unit length, its time in epoch seconds. */
const asRow = (v: SnippetVector, version = v.version): Row => ({
  id: v.id,
  unit: unit(v.vector),
  conversationId: v.conversationId,
  occurredAt: epoch(v.occurredAt),
  version,
});

function setRow(copy: Copy, v: Row) {
  let row = copy.rowOf.get(v.id);
  if (row === undefined) {
    row = copy.size++;
    if (copy.rows.length < copy.size * copy.dims) {
      // A quarter more room at a time (at least 8 rows): copies mostly grow a turn at a time.
      const capacity = copy.rows.length / copy.dims;
      const grown = new Float32Array(Math.max(copy.size, Math.ceil(capacity * 1.25), capacity + 8) * copy.dims);
      grown.set(copy.rows);
      copy.rows = grown;
    }
    copy.rowOf.set(v.id, row);
  }
  copy.rows.set(v.unit, row * copy.dims);
  copy.ids[row] = v.id;
  copy.conversations[row] = v.conversationId;
  copy.occurredAt[row] = v.occurredAt;
  copy.versions[row] = v.version;
}

/** Removes the rows `drop` picks, moving the last row into each hole. */
function removeRows(copy: Copy, drop: (row: number) => boolean) {
  for (let row = copy.size - 1; row >= 0; row--) {
    if (!drop(row)) continue;
    const last = --copy.size;
    copy.rowOf.delete(copy.ids[row]);
    if (row !== last) {
      copy.rows.copyWithin(row * copy.dims, last * copy.dims, (last + 1) * copy.dims);
      copy.ids[row] = copy.ids[last];
      copy.conversations[row] = copy.conversations[last];
      copy.occurredAt[row] = copy.occurredAt[last];
      copy.versions[row] = copy.versions[last];
      copy.rowOf.set(copy.ids[row], row);
    }
    copy.ids.length = copy.conversations.length = copy.occurredAt.length = copy.versions.length = last;
  }
}

function applyWrite(copy: Copy, write: Write) {
  if ("upsert" in write) {
    for (const v of write.upsert) {
      if (v.endUserId === copy.endUserId) {
        if (copy.size === 0) copy.dims = v.vector.length;
        else if (v.vector.length !== copy.dims) throw new Error(`a ${v.vector.length}-d vector in a ${copy.dims}-d copy`);
        setRow(copy, asRow(v, v.version ?? vectorVersion(v)));
      } else if (copy.rowOf.has(v.id)) {
        removeRows(copy, (row) => copy.ids[row] === v.id);
      }
    }
    return;
  }
  const { tenantId, selector } = write.delete;
  if (tenantId !== copy.tenantId || (selector.endUserId && selector.endUserId !== copy.endUserId)) return;
  const ids = selector.ids && new Set(selector.ids);
  const before = selector.occurredBefore && epoch(selector.occurredBefore);
  removeRows(
    copy,
    (row) =>
      (!ids || ids.has(copy.ids[row])) &&
      (!selector.conversationId || copy.conversations[row] === selector.conversationId) &&
      (before === undefined || copy.occurredAt[row] < before),
  );
}

/** The k rows nearest to a unit query by cosine, leaving one conversation out. */
function nearest(copy: Copy, query: Float32Array, excludeConversationId: string | null | undefined, k: number): VectorHit[] {
  if (k <= 0) return [];
  const top: { row: number; similarity: number }[] = [];
  const { rows, dims } = copy;
  for (let row = 0; row < copy.size; row++) {
    if (excludeConversationId && copy.conversations[row] === excludeConversationId) continue;
    let dot = 0;
    for (let i = 0, at = row * dims; i < dims; i++, at++) dot += rows[at] * query[i];
    if (top.length === k && dot <= top[k - 1].similarity) continue;
    let at = top.length === k ? k - 1 : top.length;
    while (at > 0 && top[at - 1].similarity < dot) at--;
    top.splice(at, 0, { row, similarity: dot });
    if (top.length > k) top.pop();
  }
  return top.map(({ row, similarity }) => ({ id: copy.ids[row], similarity }));
}

export type CachedVectorStore = VectorStore & {
  /** How many users' vectors this instance holds, and their bytes (checks and benches). */
  stats(): { users: number; vectors: number; bytes: number };
  /** Resolves once every copy that is loading has loaded or failed (tests). */
  loaded(): Promise<void>;
};

export function withVectorCache(store: VectorStore, options: VectorCacheOptions): CachedVectorStore {
  const { maxBytes, ttlMs, pubsub, log } = options;
  const maxPerUser = options.maxPerUser ?? 10_000;
  const now = options.now ?? (() => performance.now());
  const origin = randomUUID();
  const copies = new Map<string, Copy>();
  const loading = new Set<Promise<void>>();
  // Loads asked for while MAX_LOADS ran, by user, started in turn as others finish: a copy older
  // than ttlMs is reloaded even when every search finds the loads busy.
  const queued = new Map<string, () => boolean>();
  // Deletes under way (between their two passes), so a copy that starts loading meanwhile gets them too.
  const deleting = new Set<Extract<Write, { delete: unknown }>>();
  // Another instance's new vectors being read from Chroma: the writes that land meanwhile, applied after them.
  const fetching = new Set<Write[]>();
  // Users whose vectors did not fit, were too many or could not be read: when to try again, and how often they were refused.
  const declined = new Map<string, { until: number; times: number }>();

  const keyOf = (space: VectorSpace, endUserId: string) => `${collectionName(space)}\u0000${endUserId}`;
  const usedBytes = () => [...copies.values()].reduce((sum, c) => sum + (c.landed ? 0 : bytesOf(c)), 0);
  const deletesOf = (tenantId: string) => [...deleting].filter((w) => w.delete.tenantId === tenantId);
  // Not refused, or refused long enough ago: a load may be tried.
  const mayLoad = (key: string) => (declined.get(key)?.until ?? 0) <= now();

  // Copies twice ttlMs old whose users nobody searched for as long go, at most once a ttlMs, on a
  // search and on a timer, so the vectors of a user forgotten on another instance (no Redis to
  // hear of it) do not stay in memory. A copy still searched stays however old: while Chroma
  // cannot be read, it is what answers.
  let sweptAt = now();
  function dropExpired() {
    if (now() - sweptAt < ttlMs) return;
    sweptAt = now();
    for (const copy of copies.values()) {
      const idle = now() - copy.loadedAt >= 2 * ttlMs && now() - copy.searchedAt >= 2 * ttlMs;
      if (!copy.landed && !copy.next && idle) copies.delete(copy.key);
    }
  }
  const expiry = setInterval(dropExpired, ttlMs);
  expiry.unref();

  function decline(key: string, backoffMs: number) {
    const times = (declined.get(key)?.times ?? 0) + 1;
    // Doubling up to 16 times, so a user who never fits is not read whole at every interval.
    declined.set(key, { until: now() + backoffMs * 2 ** Math.min(times - 1, 4), times });
    if (declined.size > 10_000) for (const [k, d] of declined) if (d.until <= now()) declined.delete(k);
  }

  /**
   * Room for `bytes` in place of `keep` (the copy a load replaces, the loading one, or one that
   * grew), dropping copies not searched within ttlMs, least recent first, only if that makes
   * enough; false when nothing would.
   */
  function makeRoom(bytes: number, keep: Copy): boolean {
    let used = usedBytes() - (keep.landed ? 0 : bytesOf(keep));
    if (used + bytes <= maxBytes) return true;
    const idle = [...copies.values()]
      .filter((c) => c !== keep && !c.landed && now() - c.searchedAt >= ttlMs)
      .sort((a, b) => a.searchedAt - b.searchedAt);
    if (used - idle.reduce((sum, c) => sum + bytesOf(c), 0) + bytes > maxBytes) return false;
    for (const copy of idle) {
      if (used + bytes <= maxBytes) break;
      copies.delete(copy.key);
      used -= bytesOf(copy);
    }
    return true;
  }

  /**
   * Loads a user's copy from Chroma in the background. With `stale`, the copy it replaces goes on
   * answering until then (and is dropped if the user no longer fits).
   */
  function load(space: VectorSpace, endUserId: string, stale?: Copy) {
    const key = keyOf(space, endUserId);
    const startedAt = now();
    const copy: Copy = {
      key,
      tenantId: space.tenantId,
      collection: collectionName(space),
      endUserId,
      landed: deletesOf(space.tenantId),
      loadedAt: startedAt,
      readWholeAt: startedAt,
      searchedAt: stale?.searchedAt ?? startedAt,
      dims: 0,
      size: 0,
      ids: [],
      conversations: [],
      occurredAt: [],
      versions: [],
      rows: new Float32Array(0),
      rowOf: new Map(),
    };
    if (stale) stale.next = copy;
    else copies.set(key, copy);
    // Still wanted: not dropped by another instance's write, nor replaced, meanwhile.
    const wanted = () => (stale ? copies.get(key) === stale && stale.next === copy : copies.get(key) === copy);
    const done = (async () => {
      try {
        const late = `no answer from the vector store within ${LOAD_TIMEOUT_MS / 1000} s`;
        const listed = await withTimeout(store.versionsOf(space, endUserId, maxPerUser), LOAD_TIMEOUT_MS, late);
        if (!wanted()) return;
        // A reload reads again only the vectors that are new or changed since the copy it
        // replaces was loaded (about 6 KB of JSON each, parsed on the event loop): the others are
        // taken from that copy now. Writes that land from here on are in this copy's journal. A
        // vector with no fingerprint (stored before Engram kept one) is always read again, and
        // every WHOLE_READ_EVERY reloads all are: a writer that does not set the fingerprint
        // (an older Engram beside this one) would otherwise leave a stale one in place.
        const partial = stale && startedAt - stale.readWholeAt < ttlMs * WHOLE_READ_EVERY;
        if (partial) copy.readWholeAt = stale.readWholeAt;
        const kept: Row[] = [];
        const toRead: string[] = [];
        for (const [id, version] of listed ?? []) {
          const row = stale?.rowOf.get(id);
          if (partial && row !== undefined && version !== undefined && stale.versions[row] === version) {
            kept.push({
              id,
              unit: stale.rows.slice(row * stale.dims, (row + 1) * stale.dims),
              conversationId: stale.conversations[row],
              occurredAt: stale.occurredAt[row],
              version,
            });
          } else toRead.push(id);
        }
        // Deleted since they were listed, or moved to another user: not this user's.
        const read = listed && (await withTimeout(store.vectorsByIds(space, toRead), LOAD_TIMEOUT_MS, late)).filter((v) => v.endUserId === endUserId);
        if (!wanted()) return;
        const rows = read ? [...kept, ...read.map((v) => asRow(v))] : null;
        const dims = rows?.[0]?.unit.length ?? 0;
        const bytes = rows ? rows.length * (dims * 4 + ROW_OVERHEAD_BYTES) : 0;
        if (!rows || !makeRoom(bytes, stale ?? copy)) {
          copies.delete(key);
          decline(key, ttlMs);
          log.debug("vector cache: a user searched in Chroma", { tenantId: space.tenantId, endUserId, vectors: rows?.length ?? `over ${maxPerUser}` });
          return;
        }
        copy.dims = dims;
        copy.rows = new Float32Array(rows.length * dims);
        for (const row of rows) setRow(copy, row);
        for (const write of copy.landed ?? []) applyWrite(copy, write);
        copy.landed = null;
        copies.set(key, copy);
        declined.delete(key);
      } catch (error) {
        if (wanted()) {
          if (stale) stale.next = undefined;
          else copies.delete(key);
          // Not at every search while Chroma cannot answer (a stale copy goes on answering).
          decline(key, Math.min(ttlMs, RETRY_MS));
        }
        log.debug("vector cache: could not load a user's vectors", { tenantId: space.tenantId, endUserId, error });
      }
    })();
    loading.add(done);
    void done.finally(() => {
      loading.delete(done);
      startNext();
    });
  }

  /** Starts the first queued load that is still wanted. */
  function startNext() {
    for (const [key, start] of queued) {
      queued.delete(key);
      if (start()) return;
    }
  }

  /**
   * A user's first load, or the reload of their `stale` copy: now, or once one of the MAX_LOADS
   * running has finished (if still wanted then: no copy yet, or the same stale one not reloading,
   * and the user not refused meanwhile).
   */
  function requestLoad(space: VectorSpace, endUserId: string, stale?: Copy) {
    const key = keyOf(space, endUserId);
    const stillWanted = () => mayLoad(key) && (stale ? copies.get(key) === stale && !stale.next : !copies.has(key));
    if (loading.size < MAX_LOADS) return load(space, endUserId, stale);
    // The latest request for a user replaces theirs in the queue (a copy dropped since asks anew).
    queued.set(key, () => {
      if (!stillWanted()) return false;
      load(space, endUserId, stale);
      return true;
    });
  }

  /** Applies a write to every copy it may touch: at once to loaded ones, later to loading ones. */
  function landed(tenantId: string, write: Write, collection?: string) {
    if ("delete" in write) for (const journal of fetching) journal.push(write);
    for (const copy of copies.values()) {
      if (copy.tenantId !== tenantId || (collection && copy.collection !== collection)) continue;
      copy.next?.landed?.push(write);
      if (copy.landed) copy.landed.push(write);
      else {
        try {
          const before = bytesOf(copy);
          applyWrite(copy, write);
          // A copy that grew past the memory given makes room, or goes. (Only a copy that grew
          // sums the others: an upsert touches every copy of the tenant's collection.)
          if (bytesOf(copy) > before && usedBytes() > maxBytes && !makeRoom(bytesOf(copy), copy)) copies.delete(copy.key);
        } catch (error) {
          copies.delete(copy.key);
          log.warn("vector cache: a write did not apply; the user's copy is dropped", { tenantId, error });
        }
      }
    }
  }

  /**
   * Another instance's new vectors, for the users this one holds a copy of: read from Chroma by
   * id and applied, then the deletes that landed while they were read, again.
   */
  async function upsertedElsewhere(space: VectorSpace, endUserIds: string[], ids: string[]) {
    const users = new Set(endUserIds.filter((u) => copies.has(keyOf(space, u))));
    if (users.size === 0) return;
    const journal: Write[] = [...deletesOf(space.tenantId)];
    fetching.add(journal);
    try {
      const vectors = (await store.vectorsByIds(space, ids)).filter((v) => users.has(v.endUserId));
      // Out of the set first: re-applying the deletes would otherwise add them to this very journal.
      fetching.delete(journal);
      landed(space.tenantId, { upsert: vectors }, collectionName(space));
      for (const write of journal) landed(space.tenantId, write);
    } catch (error) {
      for (const user of users) copies.delete(keyOf(space, user));
      log.debug("vector cache: could not read another instance's new vectors; the users' copies are dropped", { tenantId: space.tenantId, error });
    } finally {
      fetching.delete(journal);
    }
  }

  const announce = (change: Omit<Payload, "origin">) => pubsub.publish("vectorsChanged", "all", { origin, ...change });

  const changes = pubsub.subscribe("vectorsChanged", "all");
  void (async () => {
    for await (const change of changes) {
      if (change.origin === origin) continue;
      try {
        heard(change);
      } catch (error) {
        // One unreadable announcement (another version's, say) must not stop the others being heard.
        log.warn("vector cache: an announcement of another instance could not be applied", { error });
      }
    }
  })().catch(() => undefined);

  /** Another instance's announced change, applied to this one's copies. */
  function heard(change: Payload) {
    if (change.deleted) {
      const { occurredBefore, ...selector } = change.deleted;
      const write: Write = {
        delete: { tenantId: change.tenantId, selector: { ...selector, ...(occurredBefore ? { occurredBefore: new Date(occurredBefore) } : {}) } },
      };
      landed(change.tenantId, write);
    }
    if (change.upserted) {
      void upsertedElsewhere({ tenantId: change.tenantId, model: change.upserted.model }, change.upserted.endUserIds, change.upserted.ids).catch((error) =>
        log.warn("vector cache: another instance's new vectors could not be applied", { tenantId: change.tenantId, error }),
      );
    }
  }

  return {
    ...store,

    async upsert(space, given) {
      // Fingerprinted once, for Chroma's metadata and this instance's copies alike.
      const vectors = given.map((v) => ({ ...v, version: vectorVersion(v) }));
      await store.upsert(space, vectors);
      if (vectors.length === 0) return;
      landed(space.tenantId, { upsert: vectors }, collectionName(space));
      announce({
        tenantId: space.tenantId,
        upserted: { model: space.model, endUserIds: [...new Set(vectors.map((v) => v.endUserId))], ids: vectors.map((v) => v.id) },
      });
    },

    async delete(tenantId, selector) {
      const write = { delete: { tenantId, selector } };
      deleting.add(write);
      landed(tenantId, write);
      try {
        await store.delete(tenantId, selector);
      } finally {
        landed(tenantId, write);
        deleting.delete(write);
        const { occurredBefore, ...rest } = selector;
        announce({ tenantId, deleted: { ...rest, ...(occurredBefore ? { occurredBefore: occurredBefore.toISOString() } : {}) } });
      }
    },

    async query(space, vector, filter, k) {
      dropExpired();
      const key = keyOf(space, filter.endUserId);
      const copy = copies.get(key);
      const retry = mayLoad(key);
      if (copy && !copy.landed) {
        // Another embedding model's query: Chroma says what is wrong.
        if (copy.size > 0 && copy.dims !== vector.length) return store.query(space, vector, filter, k);
        const age = now() - copy.loadedAt;
        // One older than ttlMs answers while its replacement loads, up to twice that age (a user
        // not searched for a while): then Chroma answers, unless it cannot be read now.
        if (age >= ttlMs && !copy.next && retry) requestLoad(space, filter.endUserId, copy);
        copy.searchedAt = now();
        if (age >= 2 * ttlMs && retry) return store.query(space, vector, filter, k);
        return nearest(copy, unit(vector), filter.excludeConversationId, k);
      }
      if (!copy && retry) requestLoad(space, filter.endUserId);
      return store.query(space, vector, filter, k);
    },

    stats() {
      const ready = [...copies.values()].filter((c) => !c.landed);
      return { users: ready.length, vectors: ready.reduce((sum, c) => sum + c.size, 0), bytes: usedBytes() };
    },

    async loaded() {
      while (loading.size) await Promise.all([...loading]);
    },

    async close() {
      clearInterval(expiry);
      queued.clear();
      copies.clear();
      await changes.return?.();
      await store.close();
    },
  };
}
