import {
  InspectorConversationsDocument,
  InspectorDirectoryDocument,
  MemoryFeedDocument,
  type MemoryFeedSubscription,
} from "@gql/graphql.ts";
import { useState } from "react";
import type { ApiError } from "../api.ts";
import { clip, Empty, Failure, Link, time } from "../components.tsx";
import { useQuery, useSubscription } from "../hooks.ts";

type Item = MemoryFeedSubscription["memoryFeed"];
const MAX_ITEMS = 300;

export type FeedFilter = { agentId?: string; endUserId?: string; conversationId?: string };

/** The agent, user and conversation pickers shared by the feed and the conversations list. */
export function FilterBar({ value, onChange, withConversation = true }: { value: FeedFilter; onChange(v: FeedFilter): void; withConversation?: boolean }) {
  const directory = useQuery(InspectorDirectoryDocument, {});
  const conversations = useQuery(
    InspectorConversationsDocument,
    { agentId: value.agentId ?? null, endUserId: value.endUserId ?? null, first: 50 },
    !withConversation,
  );
  const set = (patch: FeedFilter) => onChange({ ...value, ...patch });
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
          {directory.data?.endUsers.edges.map(({ node: u }) => (
            <option key={u.id} value={u.id}>
              {u.displayName ?? u.externalId}
            </option>
          ))}
        </select>
      </label>
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
          <p className="text">{clip(item.event.body)}</p>
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
            <span className="role">message</span> {clip(r.message)}
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

export function FeedList({ items }: { items: Item[] }) {
  return (
    <ol className="feed" aria-label="Live feed, newest first" data-testid="feed">
      {items.map((item) => (
        <li key={item.id} className={`feed-item kind-${KIND_LABEL[item.__typename]}`} data-kind={KIND_LABEL[item.__typename]}>
          <div className="meta">
            <span className="kind">{KIND_LABEL[item.__typename]}</span>
            <time dateTime={item.at}>{time(item.at)}</time>
          </div>
          <div className="body">
            <ItemBody item={item} />
          </div>
        </li>
      ))}
    </ol>
  );
}

/** Keeps the newest items of a feed subscription, newest first. */
export function useFeed(filter: FeedFilter, onItem?: (item: Item) => void) {
  const [items, setItems] = useState<Item[]>([]);
  const [error, setError] = useState<ApiError>();
  const [filterKey, setFilterKey] = useState(JSON.stringify(filter));
  if (filterKey !== JSON.stringify(filter)) {
    setFilterKey(JSON.stringify(filter));
    setItems([]);
  }
  useSubscription(
    MemoryFeedDocument,
    { agentId: filter.agentId ?? null, endUserId: filter.endUserId ?? null, conversationId: filter.conversationId ?? null },
    ({ memoryFeed }) => {
      setError(undefined);
      setItems((current) => [memoryFeed, ...current.filter((i) => i.id !== memoryFeed.id)].slice(0, MAX_ITEMS));
      onItem?.(memoryFeed);
    },
    setError,
  );
  return { items, error };
}

export function FeedView() {
  const [filter, setFilter] = useState<FeedFilter>({});
  const { items, error } = useFeed(filter);
  return (
    <section aria-labelledby="feed-title">
      <h1 id="feed-title">Live feed</h1>
      <p className="lede">What memory does as it happens: turns, summary rewrites, fact changes, recalls, events, entries and job runs. Newest first.</p>
      <FilterBar value={filter} onChange={setFilter} />
      {error && <Failure error={error} />}
      {items.length === 0 ? (
        <Empty>Nothing yet. Items appear here as agents record turns and memory works on them; this page keeps listening.</Empty>
      ) : (
        <FeedList items={items} />
      )}
    </section>
  );
}
