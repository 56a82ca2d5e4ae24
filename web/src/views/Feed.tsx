import {
  EndUserByExternalIdDocument,
  InspectorConversationsDocument,
  InspectorDirectoryDocument,
  MemoryFeedDocument,
  MemoryFeedHistoryDocument,
  type FeedKind,
  type InspectorFeedItemFragment,
} from "@gql/graphql.ts";
import { memo, useCallback, useEffect, useRef, useState } from "react";
import type { ApiError } from "../api.ts";
import { clip, Empty, Failure, Link, Prose, time } from "../components.tsx";
import { useFilterInUrl, useQuery, useResync, useSession, useSubscription } from "../hooks.ts";

type Item = InspectorFeedItemFragment;
const PAGE = 50;

export type FeedFilter = {
  agentId?: string;
  endUserId?: string;
  conversationId?: string;
  kinds?: FeedKind[];
  /** ISO dates (yyyy-mm-dd), inclusive. */
  since?: string;
  until?: string;
};

/** The agent, user and conversation pickers shared by the feed and the conversations list. */
export function FilterBar({ value, onChange, withConversation = true }: { value: FeedFilter; onChange(v: FeedFilter): void; withConversation?: boolean }) {
  const directory = useQuery(InspectorDirectoryDocument, {});
  const conversations = useQuery(
    InspectorConversationsDocument,
    { agentId: value.agentId ?? null, endUserId: value.endUserId ?? null, first: 50 },
    !withConversation,
  );
  const set = (patch: FeedFilter) => onChange({ ...value, ...patch });
  // The picker lists the 100 most recently added or updated users; anyone else is found by their own id.
  const { engram } = useSession();
  const listed = directory.data?.endUsers.edges.map((e) => e.node) ?? [];
  const [found, setFound] = useState<(typeof listed)[number]>();
  const [notFound, setNotFound] = useState<string>();
  const chosen = value.endUserId && !listed.some((u) => u.id === value.endUserId) ? (found?.id === value.endUserId ? found : { id: value.endUserId, externalId: value.endUserId, displayName: null }) : undefined;
  const find = async (externalId: string) => {
    const { endUserByExternalId: user } = await engram.request(EndUserByExternalIdDocument, { externalId });
    setNotFound(user ? undefined : externalId);
    if (!user) return;
    setFound(user);
    set({ endUserId: user.id, conversationId: undefined });
  };
  return (
    <form className="filters" onSubmit={(e) => e.preventDefault()} aria-label="Filters">
      <label>
        Agent
        <select value={value.agentId ?? ""} onChange={(e) => set({ agentId: e.target.value || undefined, conversationId: undefined })}>
          <option value="">All agents</option>
          {directory.data?.agents.map((a) => (
            <option key={a.id} value={a.id}>
              {a.name} ({a.externalId})
            </option>
          ))}
        </select>
      </label>
      <label>
        User
        <select value={value.endUserId ?? ""} onChange={(e) => set({ endUserId: e.target.value || undefined, conversationId: undefined })}>
          <option value="">All users</option>
          {chosen && <option value={chosen.id}>{chosen.displayName ?? chosen.externalId}</option>}
          {listed.map((u) => (
            <option key={u.id} value={u.id}>
              {u.displayName ?? u.externalId}
            </option>
          ))}
        </select>
      </label>
      {directory.data?.endUsers.pageInfo.hasNextPage && (
        <label>
          Find by id
          <input
            type="search"
            placeholder="their id, Enter"
            onKeyDown={(e) => {
              const text = e.currentTarget.value.trim();
              if (e.key === "Enter" && text) void find(text).catch(() => setNotFound(text));
            }}
          />
          {notFound && <span className="muted"> No user {notFound}.</span>}
        </label>
      )}
      {withConversation && (
        <label>
          Conversation
          <select value={value.conversationId ?? ""} onChange={(e) => set({ conversationId: e.target.value || undefined })}>
            <option value="">All conversations</option>
            {conversations.data?.conversations.edges.map(({ node: c }) => (
              <option key={c.id} value={c.id}>
                {c.externalId} · {c.endUser.externalId}
              </option>
            ))}
          </select>
        </label>
      )}
      {directory.error && <Failure error={directory.error} retry={directory.refetch} />}
    </form>
  );
}

function ItemBody({ item }: { item: Item }) {
  switch (item.__typename) {
    case "SummaryRevisionFeedItem": {
      const r = item.revision;
      return (
        <>
          <h3>
            <span className={r.accepted ? "badge ok" : "badge bad"}>{r.accepted ? "accepted" : "rejected"}</span> Summary rewrite
            through #{r.coveredThroughSeq} · {r.words} words ·{" "}
            <Link to={`/conversations/${item.conversation.id}`}>{item.conversation.externalId}</Link>
          </h3>
          {!r.accepted && r.reason && <p className="reason">Rejected: {r.reason}</p>}
          {r.accepted && r.reason && <p className="muted">Judge: {r.reason}</p>}
          <p className="text">{clip(r.text, 400)}</p>
        </>
      );
    }
    case "TurnFeedItem": {
      const t = item.turn;
      return (
        <>
          <h3>
            Turn #{t.firstSeq}–#{t.lastSeq} · <Link to={`/conversations/${t.conversation.id}`}>{t.conversation.externalId}</Link> ·{" "}
            {t.conversation.agent.name} with {t.conversation.endUser.externalId}
          </h3>
          {t.messages.map((m) => (
            <p key={m.seq} className="text">
              <span className="role">{m.role.toLowerCase()}</span> {clip(m.content)}
            </p>
          ))}
        </>
      );
    }
    case "EventFeedItem":
      return (
        <>
          <h3>
            Event <code>{item.event.kind}</code> · {item.event.scope.toLowerCase()} / {item.event.scopeRef} · from {item.event.source}
          </h3>
          <Prose text={clip(item.event.body, 600)} />
        </>
      );
    case "EntryFeedItem":
      return (
        <h3>
          Entry {item.entryChange.toLowerCase()} · {item.entry ? item.entry.title : <span className="muted">(forgotten)</span>} ·{" "}
          {item.scope.toLowerCase()} / {item.scopeRef}
        </h3>
      );
    case "FactFeedItem":
      return (
        <>
          <h3>
            Fact {item.factChange.toLowerCase()} · <Link to={`/users/${item.endUser.id}`}>{item.endUser.externalId}</Link>
          </h3>
          {item.text && <p className="text">{item.text}</p>}
          {item.reason && <p className="muted">{item.reason}</p>}
        </>
      );
    case "RecallFeedItem": {
      const r = item.recall;
      const chosen = r.candidates.filter((c) => c.chosen);
      return (
        <>
          <h3>
            Recall for <Link to={`/users/${item.endUser.id}`}>{item.endUser.externalId}</Link> · {chosen.length} of {r.candidates.length}{" "}
            chosen by {r.chosenBy.toLowerCase()}
            {r.conversationId && (
              <>
                {" "}
                · <Link to={`/conversations/${r.conversationId}`}>conversation</Link>
              </>
            )}
          </h3>
          <p className="text">
            <span className="role">message</span>{" "}
            {r.message ? clip(r.message) : <span className="muted">(not kept: the history holds ids and scores only)</span>}
          </p>
          {r.degraded && <p className="reason">Degraded: {r.degraded}</p>}
          {r.candidates.length > 0 && (
            <table className="candidates">
              <thead>
                <tr>
                  <th scope="col">Snippet</th>
                  <th scope="col">Vector</th>
                  <th scope="col">Keyword</th>
                  <th scope="col">Fused</th>
                  <th scope="col">Judge</th>
                  <th scope="col">Chosen</th>
                </tr>
              </thead>
              <tbody>
                {r.candidates.map((c) => (
                  <tr key={c.snippetId} className={c.chosen ? "chosen" : undefined}>
                    <td>{clip(c.text, 140)}</td>
                    <td className="num">{c.vectorScore?.toFixed(2) ?? "–"}</td>
                    <td className="num">{c.keywordScore?.toFixed(2) ?? "–"}</td>
                    <td className="num">{c.fusedScore.toFixed(3)}</td>
                    <td className="num">{c.judgeScore ?? "–"}</td>
                    <td>{c.chosen ? "yes" : ""}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </>
      );
    }
    case "JobRunFeedItem":
      return (
        <>
          <h3>
            Job <code>{item.run.name}</code> <span className={`badge ${item.run.status === "FAILED" ? "bad" : item.run.status === "SUCCEEDED" ? "ok" : ""}`}>{item.run.status.toLowerCase()}</span>
          </h3>
          {item.run.error && <p className="reason">{item.run.error}</p>}
          {item.run.result != null && <pre className="json">{JSON.stringify(item.run.result)}</pre>}
        </>
      );
    default:
      return <h3>{(item as { __typename: string }).__typename}</h3>;
  }
}

const KIND_LABEL: Record<Item["__typename"], string> = {
  SummaryRevisionFeedItem: "summary",
  TurnFeedItem: "turn",
  EventFeedItem: "event",
  EntryFeedItem: "entry",
  FactFeedItem: "fact",
  RecallFeedItem: "recall",
  JobRunFeedItem: "job",
};

// An item is drawn once: a new announcement re-renders the list, not every item's Markdown.
const FeedRow = memo(function FeedRow({ item }: { item: Item }) {
  return (
    <li className={`feed-item kind-${KIND_LABEL[item.__typename]}`} data-kind={KIND_LABEL[item.__typename]}>
      <div className="meta">
        <span className="kind">{KIND_LABEL[item.__typename]}</span>
        <time dateTime={item.at}>{time(item.at)}</time>
      </div>
      <div className="body">
        <ItemBody item={item} />
      </div>
    </li>
  );
});

/** How many items are drawn at first, and how many more each "Show older" draws. */
export const DRAWN = 200;

/**
 * The newest items, at most `DRAWN` more than the person asked to see, so a busy feed left open
 * keeps a page of bounded size; the button shows those held back, then (with `loadOlder`) asks the server.
 */
export function FeedList({ items, hasMore, loading, loadOlder }: { items: Item[]; hasMore?: boolean; loading?: boolean; loadOlder?(): void }) {
  const [drawn, setDrawn] = useState(DRAWN);
  const held = items.length - drawn;
  return (
    <>
      <ol className="feed" aria-label="Live feed, newest first" data-testid="feed">
        {items.slice(0, drawn).map((item) => (
          <FeedRow key={item.id} item={item} />
        ))}
      </ol>
      {held > 0 ? (
        <button type="button" className="more" onClick={() => setDrawn((n) => n + DRAWN)}>
          Show older ({held} more)
        </button>
      ) : (
        hasMore &&
        loadOlder && (
          <button type="button" className="more" onClick={loadOlder} disabled={loading}>
            {loading ? "Loading…" : "Load older"}
          </button>
        )
      )}
    </>
  );
}

const KIND_OF: Record<Item["__typename"], FeedKind> = {
  SummaryRevisionFeedItem: "SUMMARY_REVISION",
  TurnFeedItem: "TURN",
  EventFeedItem: "EVENT",
  EntryFeedItem: "ENTRY",
  FactFeedItem: "FACT",
  RecallFeedItem: "RECALL",
  JobRunFeedItem: "JOB_RUN",
};

const KIND_CHOICES: { kind: FeedKind; label: string }[] = [
  { kind: "TURN", label: "Turns" },
  { kind: "SUMMARY_REVISION", label: "Summaries" },
  { kind: "FACT", label: "Facts" },
  { kind: "RECALL", label: "Recalls" },
  { kind: "EVENT", label: "Events" },
  { kind: "ENTRY", label: "Entries" },
  { kind: "JOB_RUN", label: "Jobs" },
];

const endOfDay = (day: string) => new Date(`${day}T23:59:59.999`).toISOString();
const startOfDay = (day: string) => new Date(`${day}T00:00:00`).toISOString();

/**
 * The feed: its history from the server (newest first, a page at a time), with what the
 * subscription announces put on top as it happens. A filter change reloads the history.
 */
export function useFeed(filter: FeedFilter, onItem?: (item: Item) => void) {
  const { engram } = useSession();
  const [items, setItems] = useState<Item[]>([]);
  const [error, setError] = useState<ApiError>();
  const [cursor, setCursor] = useState<{ after: string | null; hasMore: boolean }>({ after: null, hasMore: false });
  const [loading, setLoading] = useState(true);
  const key = JSON.stringify(filter);
  const variables = {
    agentId: filter.agentId ?? null,
    endUserId: filter.endUserId ?? null,
    conversationId: filter.conversationId ?? null,
    kinds: filter.kinds?.length ? filter.kinds : null,
    since: filter.since ? startOfDay(filter.since) : null,
    until: filter.until ? endOfDay(filter.until) : null,
    first: PAGE,
  };
  const merge = (current: Item[], more: Item[]) => {
    const seen = new Set(current.map((i) => i.id));
    return [...current, ...more.filter((i) => !seen.has(i.id))];
  };
  const load = useCallback(
    async (after: string | null, current: boolean[] = [true]) => {
      setLoading(true);
      try {
        const { memoryFeed } = await engram.request(MemoryFeedHistoryDocument, { ...variables, after });
        if (!current[0]) return;
        setError(undefined);
        setItems((items) => merge(items, memoryFeed.items));
        setCursor({ after: memoryFeed.endCursor ?? null, hasMore: memoryFeed.hasMore });
      } catch (failure) {
        if (current[0]) setError(failure as ApiError);
      } finally {
        if (current[0]) setLoading(false);
      }
    },
    // eslint-disable-next-line react-hooks/exhaustive-deps
    [engram, key],
  );
  useEffect(() => {
    const current = [true];
    setItems([]);
    void load(null, current);
    return () => void (current[0] = false);
  }, [load]);
  // What is on screen, and the live items that arrive while a resync reads the newest page.
  const shown = useRef(items);
  shown.current = items;
  const arriving = useRef<Item[] | null>(null);
  const filterKey = useRef(key);
  filterKey.current = key;
  // The socket was lost and is back: what it announced meanwhile never arrived, so the newest page
  // is read again and put above what was shown (older pages stay when the new page reaches them).
  useResync(async () => {
    const arrived: Item[] = [];
    arriving.current = arrived;
    const asked = key;
    try {
      const { memoryFeed } = await engram.request(MemoryFeedHistoryDocument, { ...variables, after: null });
      if (filterKey.current !== asked) return;
      const page = memoryFeed.items;
      const last = page.at(-1);
      const reached = last ? shown.current.findIndex((i) => i.id === last.id) : -1;
      const older = reached >= 0 ? shown.current.slice(reached + 1) : [];
      setItems(merge(merge(arrived, page), older));
      if (reached < 0) setCursor({ after: memoryFeed.endCursor ?? null, hasMore: memoryFeed.hasMore });
      setError(undefined);
    } catch (failure) {
      if (filterKey.current === asked) setError(failure as ApiError);
    } finally {
      if (arriving.current === arrived) arriving.current = null;
    }
  });
  useSubscription(
    MemoryFeedDocument,
    { agentId: variables.agentId, endUserId: variables.endUserId, conversationId: variables.conversationId },
    ({ memoryFeed }) => {
      setError(undefined);
      const wanted = (!filter.kinds?.length || filter.kinds.includes(KIND_OF[memoryFeed.__typename])) && !filter.until;
      if (wanted) {
        const arrived = arriving.current;
        if (arrived) arrived.splice(0, arrived.length, memoryFeed, ...arrived.filter((i) => i.id !== memoryFeed.id));
        setItems((current) => [memoryFeed, ...current.filter((i) => i.id !== memoryFeed.id)]);
      }
      onItem?.(memoryFeed);
    },
    setError,
  );
  const loadOlder = () => void load(cursor.after);
  return { items, error, loading, hasMore: cursor.hasMore, loadOlder };
}

/** The feed's filters as the URL holds them: ?agent=&user=&conversation=&kinds=TURN,FACT&since=&until= */
export const useFeedFilterInUrl = () =>
  useFilterInUrl<FeedFilter>(
    { agentId: "agent", endUserId: "user", conversationId: "conversation", kinds: "kinds", since: "since", until: "until" },
    ["kinds"],
  );

/** Kind checkboxes and a date range: the feed's and the search's filters below their bars. */
export function KindAndTimeFilters<K extends string>({
  choices,
  kinds,
  since,
  until,
  onChange,
}: {
  choices: { kind: K; label: string }[];
  kinds: K[];
  since?: string;
  until?: string;
  onChange(change: { kinds?: K[]; since?: string; until?: string }): void;
}) {
  const toggle = (kind: K) => onChange({ kinds: kinds.includes(kind) ? kinds.filter((k) => k !== kind) : [...kinds, kind] });
  return (
    <div className="filters kinds">
      <fieldset>
        <legend>Kinds</legend>
        {choices.map(({ kind, label }) => (
          <label key={kind} className="check">
            <input type="checkbox" checked={kinds.includes(kind)} onChange={() => toggle(kind)} /> {label}
          </label>
        ))}
      </fieldset>
      <label>
        From
        <input type="date" value={since ?? ""} onChange={(e) => onChange({ since: e.target.value || undefined })} />
      </label>
      <label>
        To
        <input type="date" value={until ?? ""} onChange={(e) => onChange({ until: e.target.value || undefined })} />
      </label>
    </div>
  );
}

export function FeedView() {
  const [filter, setFilter] = useFeedFilterInUrl();
  const { items, error, loading, hasMore, loadOlder } = useFeed(filter);
  return (
    <section aria-labelledby="feed-title">
      <h1 id="feed-title">Live feed</h1>
      <p className="lede">What memory does: turns, summary rewrites, fact changes, recalls, events, entries and job runs, newest first, as it happens and from its history.</p>
      <FilterBar value={filter} onChange={setFilter} />
      <KindAndTimeFilters
        choices={KIND_CHOICES}
        kinds={filter.kinds ?? []}
        since={filter.since}
        until={filter.until}
        onChange={(change) => setFilter({ ...filter, ...change })}
      />
      {error && <Failure error={error} />}
      <h2 className="sr-only">Items, newest first</h2>
      <FeedPaged items={items} loading={loading} hasMore={hasMore} loadOlder={loadOlder} />
    </section>
  );
}

/** The feed's items with a button for the older ones. */
export function FeedPaged({ items, loading, hasMore, loadOlder, empty }: { items: Item[]; loading: boolean; hasMore: boolean; loadOlder(): void; empty?: string }) {
  return (
    <>
      {items.length === 0 ? (
        <Empty>{loading ? "Loading…" : (empty ?? "Nothing matches. Items appear here as agents record turns and memory works on them; this page keeps listening.")}</Empty>
      ) : (
        <FeedList items={items} hasMore={hasMore} loading={loading} loadOlder={loadOlder} />
      )}
    </>
  );
}
