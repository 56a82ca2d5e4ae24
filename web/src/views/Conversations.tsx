import {
  InspectorContextDocument,
  InspectorConversationDocument,
  InspectorConversationsDocument,
  type InspectorRevisionFragment,
} from "@gql/graphql.ts";
import { useEffect, useState, type FormEvent } from "react";
import { Diff, Empty, Failure, LineChart, Link, Loading, time } from "../components.tsx";
import { useQuery, useThrottled } from "../hooks.ts";
import { FeedList, FilterBar, useFeed, type FeedFilter } from "./Feed.tsx";

export function ConversationsView({ id }: { id?: string }) {
  return id ? <ConversationDetail id={id} /> : <ConversationList />;
}

function ConversationList() {
  const [filter, setFilter] = useState<FeedFilter>({});
  const list = useQuery(InspectorConversationsDocument, { agentId: filter.agentId ?? null, endUserId: filter.endUserId ?? null, first: 100 });
  const rows = list.data?.conversations.edges ?? [];
  return (
    <section aria-labelledby="conversations-title">
      <h1 id="conversations-title">Conversations</h1>
      <FilterBar value={filter} onChange={setFilter} withConversation={false} />
      {list.error && <Failure error={list.error} retry={list.refetch} />}
      {list.loading && !list.data && <Loading />}
      {list.data && rows.length === 0 && <Empty>No conversations yet. They appear once an agent records a turn.</Empty>}
      {rows.length > 0 && (
        <table>
          <thead>
            <tr>
              <th scope="col">Conversation</th>
              <th scope="col">Agent</th>
              <th scope="col">User</th>
              <th scope="col">Messages</th>
              <th scope="col">Last active</th>
            </tr>
          </thead>
          <tbody>
            {rows.map(({ node: c }) => (
              <tr key={c.id}>
                <td>
                  <Link to={`/conversations/${c.id}`}>{c.externalId}</Link>
                </td>
                <td>{c.agent.name}</td>
                <td>
                  <Link to={`/users/${c.endUser.id}`}>{c.endUser.displayName ?? c.endUser.externalId}</Link>
                </td>
                <td>{c.lastSeq}</td>
                <td>{time(c.updatedAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

function Revisions({ revisions }: { revisions: InspectorRevisionFragment[] }) {
  if (!revisions.length) return <Empty>No rewrites yet: the summary starts once messages fall out of the tail.</Empty>;
  // Newest first; each is compared with the one before it in time.
  return (
    <ol className="revisions" data-testid="revisions">
      {revisions.map((r, i) => {
        const previous = revisions[i + 1];
        return (
          <li key={r.id} className={r.accepted ? "accepted" : "rejected"}>
            <h3>
              <span className={r.accepted ? "badge ok" : "badge bad"}>{r.accepted ? "accepted" : "rejected"}</span> through #
              {r.coveredThroughSeq} · {r.words} words · <time dateTime={r.createdAt}>{time(r.createdAt)}</time>
            </h3>
            {r.reason && <p className={r.accepted ? "muted" : "reason"}>{r.accepted ? `Judge: ${r.reason}` : `Rejected: ${r.reason}`}</p>}
            {previous ? (
              <details>
                <summary>Changes from the revision before</summary>
                <Diff before={previous.text} after={r.text} />
              </details>
            ) : null}
            <p className="text">{r.text}</p>
          </li>
        );
      })}
    </ol>
  );
}

const SCORE_TITLE: Record<string, string> = {
  KEPT: "verbatim judge's score (0–3)",
  FACTS: "a core fact is always sent",
  ENTRIES: "importance (1–5)",
  RECALL: "relevance",
};

/** What an item's score means depends on its block: the FACTS block's is the core flag. */
function scoreLabel(kind: string, score: number | null | undefined) {
  if (score == null) return "";
  if (kind === "FACTS") return score ? "core" : "";
  if (kind === "ENTRIES") return `importance ${score}`;
  return `score ${score}`;
}

function ContextBlocks({ conversationId, refresh }: { conversationId: string; refresh: number }) {
  const [draft, setDraft] = useState("");
  // Assembling may call a model (the recall gate, the re-rank judge): only when asked to.
  const [message, setMessage] = useState<string | null>(null);
  const context = useQuery(InspectorContextDocument, { input: { conversationId, message: message ?? "" } }, message === null);
  const { refetch } = context;
  useEffect(() => {
    if (refresh && message !== null) refetch();
  }, [refresh, refetch, message]);
  const submit = (e: FormEvent) => {
    e.preventDefault();
    if (message === draft) refetch();
    else setMessage(draft);
  };
  const c = context.data?.context;
  return (
    <section aria-labelledby="context-title">
      <h2 id="context-title">Context for the next call</h2>
      <form className="inline" onSubmit={submit}>
        <label htmlFor="probe">Next user message (facts, notes and recall depend on it)</label>
        <input id="probe" value={draft} onChange={(e) => setDraft(e.target.value)} placeholder="e.g. Which hotel did I like last time?" />
        <button type="submit">Assemble</button>
      </form>
      {context.error && <Failure error={context.error} retry={context.refetch} />}
      {message === null && <Empty>Press Assemble to see what the next call would send (this may call the model).</Empty>}
      {c && message !== null && (
        <>
          <p className="totals" data-testid="context-totals">
            <strong>{c.totalTokens}</strong> tokens sent · baseline {c.baselineTokens} · saved{" "}
            <strong className={c.savedTokens >= 0 ? "good" : "bad"}>{c.savedTokens}</strong>
          </p>
          {c.blocks.length === 0 && <Empty>The context is empty.</Empty>}
          {c.blocks.map((block) => (
            <article key={block.kind} className={`block block-${block.kind.toLowerCase()}`} data-testid={`block-${block.kind}`}>
              <h3>
                {block.title} <span className="muted">· {block.kind.toLowerCase()} · {block.tokens} tokens</span>
              </h3>
              {block.kind === "SUMMARY" ? (
                <p className="text">{block.text}</p>
              ) : (
                <table>
                  <tbody>
                    {block.items.map((item) => (
                      <tr key={item.id}>
                        <td className="num">{item.seq != null ? `#${item.seq}` : ""}</td>
                        <td className="num" title={SCORE_TITLE[block.kind]}>
                          {scoreLabel(block.kind, item.score)}
                        </td>
                        <td>{item.text}</td>
                        <td className="num">{item.tokens} t</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              )}
            </article>
          ))}
        </>
      )}
    </section>
  );
}

function ConversationDetail({ id }: { id: string }) {
  const [refresh, setRefresh] = useState(0);
  const [shown, setShown] = useState(40);
  const conversation = useQuery(InspectorConversationDocument, { id, lastMessages: shown });
  const reload = useThrottled(() => {
    conversation.refetch();
    setRefresh((n) => n + 1);
  }, 500);
  const { items } = useFeed({ conversationId: id }, reload);
  if (conversation.error && !conversation.data) return <Failure error={conversation.error} retry={conversation.refetch} />;
  if (!conversation.data) return <Loading />;
  const { conversation: c, contextTimeline } = conversation.data;
  const messages = c.messages.edges.map((e) => e.node);
  return (
    <section aria-labelledby="conversation-title" className="conversation">
      <p className="crumbs">
        <Link to="/conversations">Conversations</Link> ›
      </p>
      <h1 id="conversation-title">
        {c.externalId} <span className="muted">· {c.agent.name} with </span>
        <Link to={`/users/${c.endUser.id}`}>{c.endUser.displayName ?? c.endUser.externalId}</Link>
      </h1>
      <p className="lede">
        {c.lastSeq} messages · summary {c.agent.settings.summaryOn ? `on, covers through #${c.summaryThroughSeq}` : "off"} · tail{" "}
        {c.agent.settings.tailSize} · baseline window {c.agent.settings.historySize}
      </p>
      <div className="columns">
        <div>
          <section aria-labelledby="summary-title">
            <h2 id="summary-title">Current summary</h2>
            {c.summary ? <p className="text summary" data-testid="summary">{c.summary}</p> : <Empty>No summary yet.</Empty>}
          </section>
          <section aria-labelledby="chart-title">
            <h2 id="chart-title">Tokens sent against the baseline, per turn</h2>
            {contextTimeline.length < 2 ? (
              <Empty>The chart needs two turns or more.</Empty>
            ) : (
              <LineChart
                title="Tokens sent and baseline per turn"
                unit="tokens"
                labels={contextTimeline.map((p) => `#${p.seq}`)}
                series={[
                  { name: "baseline (history sent whole)", className: "series-baseline", values: contextTimeline.map((p) => p.baselineTokens) },
                  { name: "sent (summary + kept + tail)", className: "series-sent", values: contextTimeline.map((p) => p.sentTokens) },
                ]}
              />
            )}
          </section>
          <ContextBlocks conversationId={c.id} refresh={refresh} />
        </div>
        <div>
          <section aria-labelledby="revisions-title">
            <h2 id="revisions-title">Summary revisions ({c.revisions.length})</h2>
            <Revisions revisions={c.revisions} />
          </section>
          <section aria-labelledby="messages-title">
            <h2 id="messages-title">Latest messages</h2>
            <table className="messages">
              <thead>
                <tr>
                  <th scope="col">#</th>
                  <th scope="col">Role</th>
                  <th scope="col">Message</th>
                  <th scope="col" title="The verbatim judge's score: 0 noise, 1 background, 2 useful, 3 essential">
                    Keep
                  </th>
                </tr>
              </thead>
              <tbody>
                {[...messages].reverse().flatMap((m, i, newestFirst) => {
                  const older = newestFirst[i + 1];
                  // A gap in the numbering is messages not shown here: private steps, or forgotten.
                  const gap = older ? m.seq - older.seq - 1 : 0;
                  const row = (
                    <tr key={m.id} className={m.seq <= c.summaryThroughSeq ? "folded" : "unfolded"}>
                      <td className="num">{m.seq}</td>
                      <td>{m.role.toLowerCase()}</td>
                      <td>{m.content}</td>
                      <td className="num">{m.keepScore ?? ""}</td>
                    </tr>
                  );
                  return gap > 0
                    ? [
                        row,
                        <tr key={`gap-${m.seq}`} className="gap" data-testid="message-gap">
                          <td className="num">{gap === 1 ? `#${older.seq + 1}` : `#${older.seq + 1}–#${m.seq - 1}`}</td>
                          <td colSpan={3} className="muted">
                            {gap === 1 ? "1 message" : `${gap} messages`} not shown: private steps (tool calls, system notes) or forgotten.
                          </td>
                        </tr>,
                      ]
                    : [row];
                })}
              </tbody>
            </table>
            {c.messages.pageInfo.hasPreviousPage && (
              <button type="button" className="more" onClick={() => setShown((n) => n + 40)} disabled={conversation.loading}>
                {conversation.loading ? "Loading…" : "Load older messages"}
              </button>
            )}
          </section>
          <section aria-labelledby="conv-feed-title">
            <h2 id="conv-feed-title">Live</h2>
            {items.length ? <FeedList items={items} /> : <Empty>Listening for this conversation's turns, rewrites and facts.</Empty>}
          </section>
        </div>
      </div>
    </section>
  );
}
