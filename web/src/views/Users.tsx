import {
  InspectorAddFactDocument,
  InspectorCorrectFactDocument,
  InspectorDeleteFactDocument,
  InspectorFactHistoryDocument,
  InspectorForgetRecordsDocument,
  InspectorForgetUserDocument,
  InspectorResolveContradictionDocument,
  InspectorUserDocument,
  InspectorUsersDocument,
  type ContradictionChoice,
  type InspectorFactFragment,
  type InspectorForgetReceiptFragment,
} from "@gql/graphql.ts";
import { useEffect, useState, type FormEvent } from "react";
import type { ApiError } from "../api.ts";
import { Empty, Failure, Link, Loading, time } from "../components.tsx";
import { canWrite, usePaged, useQuery, useResync, useSession, useThrottled } from "../hooks.ts";
import { FeedList, useFeed } from "./Feed.tsx";

export function UsersView({ id }: { id?: string }) {
  return id ? <UserDetail id={id} /> : <UserList />;
}

/** Every user, most recently added or updated first (endUsers' order), a page of 100 at a time (the list stopped at 100). */
function UserList() {
  const { first, nodes: users, hasMore, loadMore, loading, error } = usePaged(InspectorUsersDocument, {}, ({ endUsers }) => ({
    nodes: endUsers.edges.map((e) => e.node),
    endCursor: endUsers.pageInfo.endCursor ?? null,
    hasNextPage: endUsers.pageInfo.hasNextPage,
  }));
  return (
    <section aria-labelledby="users-title">
      <h1 id="users-title">Users</h1>
      <p className="lede">The people agents talk to, and what memory knows about each of them, the most recently added first.</p>
      {first.error && <Failure error={first.error} retry={first.refetch} />}
      {first.loading && !first.data && <Loading />}
      {first.data && users.length === 0 && <Empty>No users yet. They appear once an agent records a turn with them.</Empty>}
      {users.length > 0 && (
        <ul className="plain" data-testid="users">
          {users.map((u) => (
            <li key={u.id}>
              <Link to={`/users/${u.id}`}>{u.displayName ?? u.externalId}</Link>
              {u.displayName && <span className="muted"> · {u.externalId}</span>}
            </li>
          ))}
        </ul>
      )}
      {error && <Failure error={error} retry={loadMore} />}
      {hasMore && (
        <button type="button" className="more" onClick={loadMore} disabled={loading}>
          {loading ? "Loading…" : "More users"}
        </button>
      )}
    </section>
  );
}

function FactHistory({ factId }: { factId: string }) {
  const history = useQuery(InspectorFactHistoryDocument, { factId });
  if (history.error) return <Failure error={history.error} />;
  if (!history.data) return <Loading />;
  return (
    <ol className="history">
      {history.data.factHistory.map((v) => (
        <li key={v.id}>
          <time dateTime={v.createdAt}>{time(v.createdAt)}</time> · {v.change.toLowerCase()}
          {v.core && " · core"}: {v.text}
          {v.reason && <span className="muted"> ({v.reason})</span>}
        </li>
      ))}
    </ol>
  );
}

function FactRow({
  fact,
  writable,
  onChanged,
  onDeleted,
}: {
  fact: InspectorFactFragment;
  writable: boolean;
  onChanged(): void;
  onDeleted(fact: InspectorFactFragment): void;
}) {
  const { engram } = useSession();
  const [editing, setEditing] = useState(false);
  const [confirmingDelete, setConfirmingDelete] = useState(false);
  const [text, setText] = useState(fact.text);
  const [core, setCore] = useState(fact.core);
  const [error, setError] = useState<ApiError>();
  const [showHistory, setShowHistory] = useState(false);
  const [resolving, setResolving] = useState(false);
  const resolve = async (keep: ContradictionChoice) => {
    try {
      await engram.request(InspectorResolveContradictionDocument, { factId: fact.id, keep });
      setResolving(false);
      setError(undefined);
      onChanged();
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  const cancel = () => {
    setEditing(false);
    setText(fact.text);
    setCore(fact.core);
    setError(undefined);
  };
  const save = async (e: FormEvent) => {
    e.preventDefault();
    // Unchanged: nothing to save, and no "corrected" version.
    if (text.trim() === fact.text && core === fact.core) return cancel();
    try {
      await engram.request(InspectorCorrectFactDocument, { id: fact.id, input: { text, core } });
      setEditing(false);
      setError(undefined);
      onChanged();
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  const remove = async () => {
    try {
      await engram.request(InspectorDeleteFactDocument, { id: fact.id });
      onDeleted(fact);
      onChanged();
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  const provenance =
    fact.origin === "EXTRACTOR"
      ? fact.sourceMessage
        ? `from message #${fact.sourceMessage.seq}`
        : "extracted"
      : fact.writtenBy
        ? `${fact.updatedAt !== fact.createdAt ? "corrected" : "written"} by ${fact.writtenBy.name || fact.writtenBy.prefix}`
        : fact.origin.toLowerCase();
  return (
    <li className={`fact ${fact.core ? "core" : ""}`} data-testid="fact">
      {editing ? (
        <form className="inline edit-fact" onSubmit={save} aria-label="Edit fact" onKeyDown={(e) => e.key === "Escape" && cancel()}>
          <label className="grow">
            <span className="sr-only">Fact</span>
            <textarea
              value={text}
              onChange={(e) => {
                setText(e.target.value);
                setError(undefined);
              }}
              aria-label="Fact text"
              rows={3}
              maxLength={500}
              autoFocus
            />
          </label>
          <label>
            <input type="checkbox" checked={core} onChange={(e) => setCore(e.target.checked)} /> core
          </label>
          <button type="submit">Save</button>
          <button type="button" onClick={cancel}>
            Cancel
          </button>
        </form>
      ) : (
        <>
          <p className="fact-text">
            {fact.core && <span className="badge core">core</span>} {fact.text}
          </p>
          <p className="muted small">
            {provenance} · confirmed {time(fact.confirmedAt)}
            {fact.sensitivity && ` · sensitive: ${fact.sensitivity}`}
            {fact.contradicts && ` · contradicts “${fact.contradicts.text}”`}
          </p>
          {fact.sourceMessage && (
            <details className="provenance">
              <summary>
                Said on {time(fact.sourceMessage.occurredAt)} (message #{fact.sourceMessage.seq})
              </summary>
              <blockquote className="text">{fact.sourceMessage.content}</blockquote>
              <Link to={`/conversations/${fact.sourceMessage.conversationId}?message=${fact.sourceMessage.seq}`}>
                Open message #{fact.sourceMessage.seq} in its conversation
              </Link>
            </details>
          )}
          <div className="actions">
            <button type="button" onClick={() => setShowHistory((v) => !v)} aria-expanded={showHistory}>
              History
            </button>
            {writable && (
              <>
                <button type="button" onClick={() => setEditing(true)}>
                  Edit
                </button>
                <button type="button" className="danger" onClick={() => setConfirmingDelete(true)}>
                  Delete
                </button>
                {fact.contradicts && (
                  <button type="button" onClick={() => setResolving(true)}>
                    Resolve…
                  </button>
                )}
              </>
            )}
          </div>
          {resolving && fact.contradicts && (
            <div role="alertdialog" aria-label="Resolve this contradiction" className="confirm">
              <p>
                This fact contradicts an older one, “{fact.contradicts.text}”. Which is true now? The one you drop is deleted with its
                history; what you keep records the choice in its history.
              </p>
              <div className="actions">
                <button type="button" onClick={() => resolve("NEWER")}>
                  Keep this one
                </button>
                <button type="button" onClick={() => resolve("OLDER")}>
                  Keep the older one
                </button>
                <button type="button" onClick={() => resolve("BOTH")}>
                  Keep both
                </button>
                <button type="button" onClick={() => setResolving(false)}>
                  Cancel
                </button>
              </div>
            </div>
          )}
          {confirmingDelete && (
            <div role="alertdialog" aria-label="Delete this fact?" className="confirm">
              <p>Delete this fact and its history? You can undo right after.</p>
              <div className="actions">
                <button type="button" className="danger" onClick={remove} autoFocus>
                  Delete fact
                </button>
                <button type="button" onClick={() => setConfirmingDelete(false)}>
                  Keep it
                </button>
              </div>
            </div>
          )}
          {showHistory && <FactHistory factId={fact.id} />}
        </>
      )}
      {error && <Failure error={error} />}
    </li>
  );
}

function AddFact({ endUserId, onAdded }: { endUserId: string; onAdded(): void }) {
  const { engram } = useSession();
  const [text, setText] = useState("");
  const [core, setCore] = useState(false);
  const [error, setError] = useState<ApiError>();
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    try {
      await engram.request(InspectorAddFactDocument, { input: { endUserId, text, core } });
      setText("");
      setCore(false);
      setError(undefined);
      onAdded();
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  return (
    <form className="inline add-fact" onSubmit={submit} aria-label="Add a fact">
      <label className="grow">
        New fact
        <input
          value={text}
          onChange={(e) => {
            setText(e.target.value);
            setError(undefined);
          }}
          placeholder="One sentence the user said, e.g. “Prefers aisle seats.”"
        />
      </label>
      <label>
        <input type="checkbox" checked={core} onChange={(e) => setCore(e.target.checked)} /> core
      </label>
      <button type="submit" disabled={text.trim().length < 3}>
        Add fact
      </button>
      {error && <Failure error={error} />}
    </form>
  );
}

function ForgetUser({ endUserId, name, onForgotten }: { endUserId: string; name: string; onForgotten(): void }) {
  const { engram } = useSession();
  const [confirming, setConfirming] = useState(false);
  const [typed, setTyped] = useState("");
  const [result, setResult] = useState<string>();
  const [error, setError] = useState<ApiError>();
  const forget = async (e: FormEvent) => {
    e.preventDefault();
    try {
      const { forgetUser } = await engram.request(InspectorForgetUserDocument, { endUserId });
      setResult(`Forgot ${receiptText(forgetUser)}.`);
      setError(undefined);
      setConfirming(false);
      setTyped("");
      onForgotten();
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  return (
    <div className="forget">
      {!confirming ? (
        <button type="button" className="danger" onClick={() => setConfirming(true)}>
          Forget everything…
        </button>
      ) : (
        <form onSubmit={forget} role="alertdialog" aria-labelledby="forget-title" className="confirm">
          <p id="forget-title">
            <strong>Forget everything about {name}?</strong> Deleted for good: every fact and its history, recall snippets, the
            summaries and revisions of their conversations, stored verdicts and job records, events and entries about them (entity scope{" "}
            <code>{name}</code>), and their messages, unless this tenant keeps forgotten messages as a record. The conversations stay
            listed, with no messages.
          </p>
          <label>
            Type <code>{name}</code> to confirm
            <input
              value={typed}
              onChange={(e) => {
                setTyped(e.target.value);
                setError(undefined);
              }}
              autoFocus
              aria-label="Confirm the user's id"
            />
          </label>
          <button type="submit" className="danger" disabled={typed !== name}>
            Forget {name}
          </button>
          <button
            type="button"
            onClick={() => {
              setConfirming(false);
              setTyped("");
              setError(undefined);
            }}
          >
            Cancel
          </button>
        </form>
      )}
      {result && (
        <p role="status" className="muted">
          {result}
        </p>
      )}
      {error && <Failure error={error} />}
    </div>
  );
}

/**
 * Everything held about the user as a JSON file, an admin key's right: streamed by the server
 * (GET /export/users/<id>), so a user of any size can be exported, where the exportUser query
 * stops at 5,000 rows of history.
 */
function ExportUser({ endUserId, name }: { endUserId: string; name: string }) {
  const { engram } = useSession();
  const [error, setError] = useState<ApiError>();
  const [busy, setBusy] = useState(false);
  const download = async () => {
    setBusy(true);
    try {
      const file = await engram.download(`export/users/${encodeURIComponent(endUserId)}`);
      const url = URL.createObjectURL(new Blob([file], { type: "application/json" }));
      const link = document.createElement("a");
      link.href = url;
      link.download = `engram-export-${name.replace(/[^\w.-]+/g, "_")}.json`;
      link.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
      setError(undefined);
    } catch (failure) {
      setError(failure as ApiError);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="export">
      <button type="button" onClick={download} disabled={busy}>
        {busy ? "Exporting…" : "Export as JSON"}
      </button>{" "}
      <span className="muted small">Facts with history, conversation summaries and revisions, recall text, and entries of their scope.</span>
      {error && <Failure error={error} />}
    </div>
  );
}

const RECEIPT_LABELS: [keyof Omit<InspectorForgetReceiptFragment, "__typename">, string][] = [
  ["facts", "facts"],
  ["factVersions", "fact versions"],
  ["snippets", "recall snippets"],
  ["summaries", "summaries"],
  ["summaryRevisions", "summary revisions"],
  ["keptVerdicts", "kept verdicts"],
  ["gateVerdicts", "gate verdicts"],
  ["messages", "messages"],
  ["jobRecords", "job records"],
  ["events", "events"],
  ["entries", "entries"],
  ["activity", "feed history rows"],
];

/** A forget's receipt in words: the kinds it deleted, with their counts. */
const receiptText = (receipt: InspectorForgetReceiptFragment) => {
  const counts = RECEIPT_LABELS.map(([key, label]) => [label, receipt[key]] as const).filter(([, n]) => n > 0);
  return counts.length ? counts.map(([label, n]) => `${n} ${label}`).join(", ") : "nothing was held";
};

/** Each forget of this user as the audit log holds it: who, when, what kinds and how many. */
function ForgetRecords({ endUserId, refresh }: { endUserId: string; refresh: number }) {
  const records = useQuery(InspectorForgetRecordsDocument, { endUserId });
  const { refetch } = records;
  useEffect(() => {
    if (refresh) refetch();
  }, [refresh, refetch]);
  if (records.error) return <Failure error={records.error} retry={records.refetch} />;
  const list = records.data?.forgetRecords ?? [];
  return (
    <section aria-labelledby="forgets-title">
      <h2 id="forgets-title">Forgets ({list.length})</h2>
      {list.length === 0 ? (
        <Empty>Nothing has been forgotten about this user.</Empty>
      ) : (
        <ul className="plain" data-testid="forget-records">
          {list.map((r) => (
            <li key={r.id}>
              <time dateTime={r.at}>{time(r.at)}</time> · {r.kind === "USER" ? "everything" : r.kind.toLowerCase()} · asked by{" "}
              {r.askedBy ? `key ${r.askedBy.name || r.askedBy.prefix}` : "the user, in a message"}: {receiptText(r.receipt)}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

function UserDetail({ id }: { id: string }) {
  const { role, engram } = useSession();
  const writable = canWrite(role);
  const user = useQuery(InspectorUserDocument, { id });
  const [deleted, setDeleted] = useState<InspectorFactFragment>();
  const [forgets, setForgets] = useState(0);
  const [undoError, setUndoError] = useState<ApiError>();
  const undo = async () => {
    if (!deleted) return;
    try {
      await engram.request(InspectorAddFactDocument, { input: { endUserId: id, text: deleted.text, core: deleted.core } });
      setDeleted(undefined);
      setUndoError(undefined);
      user.refetch();
    } catch (failure) {
      setUndoError(failure as ApiError);
    }
  };
  const reload = useThrottled(user.refetch, 300);
  const { items } = useFeed({ endUserId: id }, (item) => {
    if (item.__typename === "FactFeedItem") reload();
  });
  useResync(reload);
  if (user.error && !user.data) return <Failure error={user.error} retry={user.refetch} />;
  if (!user.data) return <Loading />;
  const { endUser, facts } = user.data;
  const name = endUser.externalId;
  return (
    <section aria-labelledby="user-title">
      <p className="crumbs">
        <Link to="/users">Users</Link> ›
      </p>
      <h1 id="user-title">
        {endUser.displayName ?? endUser.externalId}
        {endUser.displayName && <span className="muted"> · {endUser.externalId}</span>}
      </h1>
      <p className="muted small">
        <Link to={`/search?user=${id}`}>Search this user's memory</Link>
      </p>
      <div className="columns">
        <div>
          <section aria-labelledby="facts-title">
            <h2 id="facts-title">Facts ({facts.length})</h2>
            {!writable && <p className="muted">Read-only key: facts can be seen, not changed.</p>}
            {facts.length === 0 ? (
              <Empty>Nothing is known about this user.</Empty>
            ) : (
              <ul className="facts" data-testid="facts">
                {facts.map((fact) => (
                  <FactRow
                    key={`${fact.id}:${fact.updatedAt}`}
                    fact={fact}
                    writable={writable}
                    onChanged={user.refetch}
                    onDeleted={(f) => {
                      setDeleted(f);
                      setUndoError(undefined);
                    }}
                  />
                ))}
              </ul>
            )}
            {deleted && (
              <p role="status" className="undo">
                Deleted “{deleted.text}”.{" "}
                <button type="button" onClick={undo}>
                  Undo
                </button>{" "}
                <span className="muted small">(adds it back as a new fact; its old history stays deleted)</span>
              </p>
            )}
            {undoError && <Failure error={undoError} />}
            {/* Remounted after a forget, so no banner of before stays on screen. */}
            {writable && <AddFact key={forgets} endUserId={id} onAdded={user.refetch} />}
            {writable && (
              <ForgetUser
                endUserId={id}
                name={name}
                onForgotten={() => {
                  user.refetch();
                  setForgets((n) => n + 1);
                }}
              />
            )}
            <ForgetRecords endUserId={id} refresh={forgets} />
            {role === "ADMIN" && (
              <section aria-labelledby="export-title">
                <h2 id="export-title">Export</h2>
                <ExportUser endUserId={id} name={name} />
              </section>
            )}
          </section>
        </div>
        <div>
          <section aria-labelledby="user-conversations-title">
            <h2 id="user-conversations-title">Conversations</h2>
            {endUser.conversations.edges.length === 0 ? (
              <Empty>No conversations.</Empty>
            ) : (
              <ul className="plain">
                {endUser.conversations.edges.map(({ node: c }) => (
                  <li key={c.id}>
                    <Link to={`/conversations/${c.id}`}>{c.externalId}</Link>{" "}
                    <span className="muted">
                      · {c.agent.name} · {c.lastSeq} messages · {time(c.updatedAt)}
                    </span>
                  </li>
                ))}
              </ul>
            )}
          </section>
          <section aria-labelledby="user-feed-title">
            <h2 id="user-feed-title">Live</h2>
            {items.length ? <FeedList items={items} /> : <Empty>Listening for this user's fact changes, recalls and turns.</Empty>}
          </section>
        </div>
      </div>
    </section>
  );
}
