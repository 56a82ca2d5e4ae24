import {
  InspectorContextDocument,
  InspectorConversationDocument,
  InspectorConversationsDocument,
  InspectorDeleteConversationDocument,
  InspectorUpdateAgentDocument,
  type InspectorConversationQuery,
  type InspectorRevisionFragment,
} from "@gql/graphql.ts";
import { useEffect, useState, type FormEvent } from "react";
import type { ApiError } from "../api.ts";
import { Diff, Empty, Failure, LineChart, Link, Loading, time } from "../components.tsx";
import { canWrite, usePaged, useQuery, useResync, useSearchParams, useSession, useThrottled } from "../hooks.ts";
import { FeedList, FilterBar, useFeed, type FeedFilter } from "./Feed.tsx";

export function ConversationsView({ id }: { id?: string }) {
  return id ? <ConversationDetail id={id} /> : <ConversationList />;
}

function ConversationList() {
  const [filter, setFilter] = useState<FeedFilter>({});
  // A page of 100 at a time, most recently active first (the list stopped at 100).
  const { first: list, nodes: rows, hasMore, loadMore, loading, error } = usePaged(
    InspectorConversationsDocument,
    { agentId: filter.agentId ?? null, endUserId: filter.endUserId ?? null, first: 100 },
    ({ conversations }) => ({
      nodes: conversations.edges.map((edge) => edge.node),
      endCursor: conversations.pageInfo.endCursor ?? null,
      hasNextPage: conversations.pageInfo.hasNextPage,
    }),
  );
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
            {rows.map((c) => (
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
      {error && <Failure error={error} retry={loadMore} />}
      {hasMore && (
        <button type="button" className="more" onClick={loadMore} disabled={loading}>
          {loading ? "Loading…" : "More conversations"}
        </button>
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

/** Common model windows, in tokens. */
const WINDOWS = [2_000, 4_000, 8_000, 32_000, 128_000, 200_000];
const WINDOW_STORAGE = "engram.inspector.window";
const kTokens = (n: number) => `${Math.round(n / 1000)}k`;

/**
 * The assembled context as one stacked bar (a segment per block) against the model window the
 * person picks, with the baseline (the history sent whole) as a second bar on the same scale.
 */
function ContextWindowBar({ blocks, total, baseline }: { blocks: { kind: string; title: string; tokens: number }[]; total: number; baseline: number }) {
  const [size, setSize] = useState(() => Number(localStorage.getItem(WINDOW_STORAGE)) || 8_000);
  const choose = (value: number) => {
    localStorage.setItem(WINDOW_STORAGE, String(value));
    setSize(value);
  };
  const pct = (tokens: number) => `${Math.min(100, (tokens / size) * 100).toFixed(2)}%`;
  const share = (tokens: number) => `${((tokens / size) * 100).toFixed(1)}%`;
  return (
    <figure className="window" data-testid="context-window">
      <figcaption>
        <label>
          Model window
          <select value={size} onChange={(e) => choose(Number(e.target.value))}>
            {WINDOWS.map((w) => (
              <option key={w} value={w}>
                {kTokens(w)} tokens
              </option>
            ))}
          </select>
        </label>
      </figcaption>
      <p className="window-label">
        Sent: {total} tokens, {share(total)} of {kTokens(size)}
        {total > size && <strong className="bad"> · does not fit</strong>}
      </p>
      <div className="window-bar" role="img" aria-label={`Sent ${total} of ${size} tokens: ${blocks.map((b) => `${b.title} ${b.tokens}`).join(", ")}`}>
        {blocks.map((block, i) => (
          <span
            key={block.kind}
            className={`window-segment seg-${i % 6}`}
            style={{ width: pct(block.tokens) }}
            title={`${block.title}: ${block.tokens} tokens`}
            data-kind={block.kind}
            data-tokens={block.tokens}
          />
        ))}
      </div>
      <p className="window-label">
        Baseline (history sent whole): {baseline} tokens, {share(baseline)} of {kTokens(size)}
        {baseline > size && <strong className="bad"> · does not fit</strong>}
      </p>
      <div className="window-bar" role="img" aria-label={`Baseline ${baseline} of ${size} tokens`}>
        <span className="window-segment seg-baseline" style={{ width: pct(baseline) }} data-testid="baseline-segment" />
      </div>
      <p className="window-legend">
        {blocks.map((block, i) => (
          <span key={block.kind} className={`legend seg-${i % 6}`}>
            {block.title} · {block.tokens}
          </span>
        ))}
      </p>
    </figure>
  );
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
          {c.degraded.length > 0 && (
            <p className="reason" data-testid="context-degraded">
              Recall degraded: {c.degraded.join("; ")}
            </p>
          )}
          <ContextWindowBar blocks={c.blocks} total={c.totalTokens} baseline={c.baselineTokens} />
          {c.blocks.length === 0 && <Empty>The context is empty.</Empty>}
          {c.blocks.map((block) => (
            <article key={block.kind} className={`block block-${block.kind.toLowerCase()}`} data-testid={`block-${block.kind}`}>
              <h3>
                {block.title} <span className="muted">· {block.kind.toLowerCase()} · {block.tokens} tokens</span>
              </h3>
              {block.kind === "SUMMARY" ? (
                <p className="text">{block.text}</p>
              ) : (
                <table tabIndex={0} aria-label={`${block.title}: items`}>
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

type Agent = InspectorConversationQuery["conversation"]["agent"];
type Settings = Agent["settings"];

const NUMBER_SETTINGS: { key: keyof Settings; label: string; min: number; max: number }[] = [
  { key: "tailSize", label: "Tail (messages sent word for word)", min: 1, max: 100 },
  { key: "historySize", label: "History window when the summary is off (and the baseline)", min: 1, max: 500 },
  { key: "summaryWordLimit", label: "Summary word limit", min: 20, max: 1000 },
  { key: "extractionBatchSize", label: "Extraction batch (shared messages)", min: 1, max: 100 },
  { key: "quietExtractionSeconds", label: "Extract after a quiet spell of (seconds, 0 off)", min: 0, max: 604800 },
];
const BOOLEAN_SETTINGS: { key: keyof Settings; label: string }[] = [
  { key: "summaryOn", label: "Rolling summary" },
  { key: "recallOn", label: "Recall earlier conversations" },
  { key: "extractionOn", label: "Extract user facts" },
  { key: "allowSensitiveFacts", label: "Keep sensitive facts (health, finances, identity…)" },
];

/**
 * The agent's memory settings, editable by a writer; only what changed is sent. The form is
 * made anew when the saved settings come back, so whether it was just saved lives with the
 * caller: the confirmation stays until the next edit.
 */
function AgentSettingsForm({ agent, saved, setSaved }: { agent: Agent; saved: boolean; setSaved(saved: boolean): void }) {
  const { engram } = useSession();
  const [draft, setDraft] = useState<Settings>(agent.settings);
  const [error, setError] = useState<ApiError>();
  const changed = Object.fromEntries(Object.entries(draft).filter(([k, v]) => agent.settings[k as keyof Settings] !== v));
  const save = async (e: FormEvent) => {
    e.preventDefault();
    try {
      await engram.request(InspectorUpdateAgentDocument, { input: { externalId: agent.externalId, settings: changed } });
      setError(undefined);
      setSaved(true);
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  const set = (patch: Partial<Settings>) => {
    setDraft({ ...draft, ...patch });
    setSaved(false);
    setError(undefined);
  };
  return (
    <form className="settings" onSubmit={save} aria-label={`Memory settings of ${agent.name}`}>
      {BOOLEAN_SETTINGS.map(({ key, label }) => (
        <label key={key} className="check">
          <input type="checkbox" checked={Boolean(draft[key])} onChange={(e) => set({ [key]: e.target.checked })} /> {label}
        </label>
      ))}
      {NUMBER_SETTINGS.map(({ key, label, min, max }) => (
        <label key={key}>
          {label}
          <input type="number" min={min} max={max} value={String(draft[key])} onChange={(e) => set({ [key]: e.target.valueAsNumber })} required />
        </label>
      ))}
      <div className="actions">
        <button type="submit" disabled={Object.keys(changed).length === 0}>
          Save settings
        </button>
        <button type="button" onClick={() => (setDraft(agent.settings), setError(undefined))} disabled={Object.keys(changed).length === 0}>
          Reset
        </button>
      </div>
      {saved && !error && (
        <p role="status" className="muted small">
          Saved. They apply from the agent's next turn.
        </p>
      )}
      {error && <Failure error={error} />}
    </form>
  );
}

/** Deleting a conversation, after a confirmation: messages, summary, revisions and recall go, through forgetting. */
function DeleteConversation({ id, name, onDeleted }: { id: string; name: string; onDeleted(receipt: { messages: number; snippets: number; facts: number }): void }) {
  const { engram } = useSession();
  const [confirming, setConfirming] = useState(false);
  const [error, setError] = useState<ApiError>();
  const remove = async () => {
    try {
      const { deleteConversation } = await engram.request(InspectorDeleteConversationDocument, { id });
      onDeleted(deleteConversation);
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  return (
    <div className="forget">
      {!confirming ? (
        <button type="button" className="danger" onClick={() => setConfirming(true)}>
          Delete conversation…
        </button>
      ) : (
        <div role="alertdialog" aria-labelledby="delete-conversation-title" className="confirm">
          <p id="delete-conversation-title">
            <strong>Delete “{name}” for good?</strong> Its messages, summary and revisions, recall snippets and their vectors, verdicts,
            job records, and the facts extracted from its messages go; the user's other facts stay. The forget is recorded (kinds and
            counts, no content).
          </p>
          <div className="actions">
            <button type="button" className="danger" onClick={remove} autoFocus>
              Delete “{name}”
            </button>
            <button
              type="button"
              onClick={() => {
                setConfirming(false);
                setError(undefined);
              }}
            >
              Keep it
            </button>
          </div>
        </div>
      )}
      {error && <Failure error={error} />}
    </div>
  );
}

function ConversationDetail({ id }: { id: string }) {
  const { role } = useSession();
  const params = useSearchParams();
  const [deleted, setDeleted] = useState<{ name: string; endUserId: string; messages: number; snippets: number; facts: number }>();
  if (deleted) {
    return (
      <section aria-labelledby="conversation-title">
        <p className="crumbs">
          <Link to="/conversations">Conversations</Link> ›
        </p>
        <h1 id="conversation-title">{deleted.name}</h1>
        <p role="status" className="undo">
          Deleted “{deleted.name}”: {deleted.messages} messages, {deleted.snippets} recall snippets and {deleted.facts} facts extracted from
          it.
        </p>
        <p>
          <Link to={`/users/${deleted.endUserId}`}>Back to the user</Link> · <Link to="/conversations">All conversations</Link>
        </p>
      </section>
    );
  }
  // Keyed by id: nothing of one conversation's page (a "Saved." confirmation) carries to the next.
  return (
    <ConversationPage
      key={id}
      id={id}
      focus={Number(params.get("message")) || undefined}
      writable={canWrite(role)}
      manages={role === "ADMIN"}
      onDeleted={setDeleted}
    />
  );
}

/** Messages a click on "Load older" or "Load newer" adds. */
const PAGE_STEP = 40;
/** The most one read of a conversation's messages returns (the API's page). */
const MESSAGES_PAGE_MAX = 500;
/** Messages shown after a linked one that is further back than a page, for its context. */
const WINDOW_AFTER_FOCUS = 10;

function ConversationPage({
  id,
  focus,
  writable,
  manages,
  onDeleted,
}: {
  id: string;
  /** A message to show and mark (from a fact's or a search hit's provenance link). */
  focus?: number;
  writable: boolean;
  /** An admin key: agents' memory settings are the tenant's policy (upsertAgent is admin-only). */
  manages: boolean;
  onDeleted(what: { name: string; endUserId: string; messages: number; snippets: number; facts: number }): void;
}) {
  const [refresh, setRefresh] = useState(0);
  const [settingsSaved, setSettingsSaved] = useState(false);
  const [shown, setShown] = useState(40);
  // The window's last message: the newest unless a linked message is further back than 200.
  const [upTo, setUpTo] = useState<number>();
  const [lastSeq, setLastSeq] = useState<number>();
  // Placed once per linked message (a live turn arriving later does not move the window back):
  // one within the last 200 loads the messages back to it (as turns arrive too); one further back
  // opens a window around it, with older and newer messages a click away.
  const [placed, setPlaced] = useState<{ focus: number; near: boolean }>();
  const through = focus && lastSeq && placed?.near && upTo === undefined ? Math.min(MESSAGES_PAGE_MAX, lastSeq - focus + 1) : 0;
  const wanted = Math.max(shown, through);
  const conversation = useQuery(InspectorConversationDocument, { id, lastMessages: wanted, throughSeq: upTo ?? null });
  const newest = conversation.data?.conversation.lastSeq;
  useEffect(() => {
    if (newest === undefined) return;
    setLastSeq(newest);
    if (!focus || placed?.focus === focus) return;
    const near = newest - focus < 200;
    setUpTo(near ? undefined : focus + WINDOW_AFTER_FOCUS);
    setPlaced({ focus, near });
  }, [focus, newest, placed]);
  // Scrolled to once, when its row first appears: not again on every refresh, live turn or click.
  const [scrolledTo, setScrolledTo] = useState<number>();
  useEffect(() => {
    if (!focus || scrolledTo === focus) return;
    const row = document.getElementById(`message-${focus}`);
    if (!row) return;
    row.scrollIntoView({ block: "center" });
    setScrolledTo(focus);
  }, [focus, conversation.data, scrolledTo]);
  const reload = useThrottled(() => {
    conversation.refetch();
    setRefresh((n) => n + 1);
  }, 500);
  const { items } = useFeed({ conversationId: id }, reload);
  useResync(reload);
  if (conversation.error && !conversation.data) return <Failure error={conversation.error} retry={conversation.refetch} />;
  if (!conversation.data) return <Loading />;
  const { conversation: c, contextTimeline } = conversation.data;
  const messages = c.messages.edges.map((e) => e.node);
  const loadingOlder = conversation.loading && messages.length < wanted;
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
          <section aria-labelledby="settings-title">
            <h2 id="settings-title">Memory settings of {c.agent.name}</h2>
            {manages ? (
              <AgentSettingsForm
                key={JSON.stringify(c.agent.settings)}
                agent={c.agent}
                saved={settingsSaved}
                setSaved={(saved) => {
                  setSettingsSaved(saved);
                  if (saved) conversation.refetch();
                }}
              />
            ) : (
              <p className="muted">
                Summary {c.agent.settings.summaryOn ? "on" : "off"} · recall {c.agent.settings.recallOn ? "on" : "off"} · extraction{" "}
                {c.agent.settings.extractionOn ? "on" : "off"} (read-only key)
              </p>
            )}
          </section>
          {writable && (
            <DeleteConversation
              id={c.id}
              name={c.externalId}
              onDeleted={(receipt) => onDeleted({ name: c.externalId, endUserId: c.endUser.id, ...receipt })}
            />
          )}
        </div>
        <div>
          <section aria-labelledby="revisions-title">
            <h2 id="revisions-title">Summary revisions ({c.revisions.length})</h2>
            <Revisions revisions={c.revisions} />
          </section>
          <section aria-labelledby="messages-title">
            <h2 id="messages-title">Latest messages</h2>
            <table className="messages" tabIndex={0} aria-label="Messages">
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
                    <tr
                      key={m.id}
                      id={`message-${m.seq}`}
                      className={`${m.seq <= c.summaryThroughSeq ? "folded" : "unfolded"}${m.seq === focus ? " focused" : ""}`}
                      aria-current={m.seq === focus ? "true" : undefined}
                    >
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
            {/* A refresh or "Load older messages" that failed says so, over what was shown before. */}
            {conversation.error && <Failure error={conversation.error} retry={conversation.refetch} />}
            {c.messages.pageInfo.hasPreviousPage && (
              // Busy only while older messages are on their way: a live refresh of the newest ones
              // (any turn, rewrite or fact of this conversation) does not swallow the click. At the
              // API's page of 500 the window moves back instead of growing.
              <button
                type="button"
                className="more"
                onClick={() => {
                  if (wanted + PAGE_STEP <= MESSAGES_PAGE_MAX) setShown(wanted + PAGE_STEP);
                  else setUpTo((messages[0]?.seq ?? c.lastSeq) - 1 + wanted - PAGE_STEP);
                }}
                disabled={loadingOlder}
              >
                {loadingOlder ? "Loading…" : "Load older messages"}
              </button>
            )}
            {upTo !== undefined && upTo < c.lastSeq && (
              <button
                type="button"
                className="more"
                onClick={() => {
                  // Grows the window as "Load older" does (up to the API's page), so the linked
                  // message stays in view; past that the window moves on.
                  if (wanted + PAGE_STEP <= MESSAGES_PAGE_MAX) setShown(wanted + PAGE_STEP);
                  setUpTo(upTo + PAGE_STEP >= c.lastSeq ? undefined : upTo + PAGE_STEP);
                }}
              >
                Load newer messages
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
