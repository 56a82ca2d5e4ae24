import { EntriesDocument, EventsDocument, InspectorCorrectEntryDocument, type EntriesQuery, type Scope } from "@gql/graphql.ts";
import { useState, type FormEvent } from "react";
import type { ApiError } from "../api.ts";
import { Empty, Failure, Loading, Prose, time } from "../components.tsx";
import { canWrite, useQuery, useSearchParams, useSession } from "../hooks.ts";

const SCOPES: Scope[] = ["INSTITUTIONAL", "ENTITY", "PROJECT", "TEAM"];

function ScopeSelect({ id, value, onChange }: { id: string; value: Scope | ""; onChange(v: Scope | ""): void }) {
  return (
    <select id={id} value={value} onChange={(e) => onChange(e.target.value as Scope | "")}>
      <option value="">Any scope</option>
      {SCOPES.map((s) => (
        <option key={s} value={s}>
          {s.toLowerCase()}
        </option>
      ))}
    </select>
  );
}

type EntrySearch = { search: string; tags: string; scope: Scope | ""; scopeRef: string };
type Entry = EntriesQuery["entries"]["edges"][number]["node"];

const tagList = (text: string) => text.split(",").map((t) => t.trim()).filter(Boolean);

/** A writer's correction of an entry: title, summary, tags and importance; Escape cancels, unchanged sends nothing. */
function EditEntry({ entry, onDone }: { entry: Entry; onDone(changed: boolean): void }) {
  const { engram } = useSession();
  const [title, setTitle] = useState(entry.title);
  const [summary, setSummary] = useState(entry.summary);
  const [tags, setTags] = useState(entry.tags.join(", "));
  const [importance, setImportance] = useState(entry.importance);
  const [error, setError] = useState<ApiError>();
  const save = async (e: FormEvent) => {
    e.preventDefault();
    const input = {
      ...(title.trim() !== entry.title ? { title: title.trim() } : {}),
      ...(summary !== entry.summary ? { summary } : {}),
      ...(tagList(tags).join(",") !== entry.tags.join(",") ? { tags: tagList(tags) } : {}),
      ...(importance !== entry.importance ? { importance } : {}),
    };
    if (Object.keys(input).length === 0) return onDone(false);
    try {
      await engram.request(InspectorCorrectEntryDocument, { id: entry.id, input });
      onDone(true);
    } catch (failure) {
      setError(failure as ApiError);
    }
  };
  const edited = () => setError(undefined);
  return (
    <form className="edit-entry" onSubmit={save} aria-label={`Edit entry ${entry.title}`} onKeyDown={(e) => e.key === "Escape" && onDone(false)}>
      <label>
        Title
        <input value={title} onChange={(e) => (setTitle(e.target.value), edited())} maxLength={300} required autoFocus />
      </label>
      <label>
        Summary (Markdown)
        <textarea value={summary} onChange={(e) => (setSummary(e.target.value), edited())} rows={6} required />
      </label>
      <label>
        Tags (comma separated)
        <input value={tags} onChange={(e) => (setTags(e.target.value), edited())} />
      </label>
      <label>
        Importance
        <select value={importance} onChange={(e) => (setImportance(Number(e.target.value)), edited())}>
          {[1, 2, 3, 4, 5].map((n) => (
            <option key={n} value={n}>
              {n}
            </option>
          ))}
        </select>
      </label>
      <div className="actions">
        <button type="submit">Save entry</button>
        <button type="button" onClick={() => onDone(false)}>
          Cancel
        </button>
      </div>
      {error && <Failure error={error} />}
    </form>
  );
}

function EntryCard({ entry, writable, onChanged }: { entry: Entry; writable: boolean; onChanged(): void }) {
  const [editing, setEditing] = useState(false);
  const e = entry;
  return (
    <li className="card" data-testid="entry">
      {editing ? (
        <EditEntry
          entry={entry}
          onDone={(changed) => {
            setEditing(false);
            if (changed) onChanged();
          }}
        />
      ) : (
        <>
          <h3>
            {e.title} <span className="muted">· importance {e.importance} · {e.source.toLowerCase()}</span>
          </h3>
          <p className="muted small">
            {e.scope.toLowerCase()} / {e.scopeRef} · updated {time(e.updatedAt)}
            {e.tags.length > 0 && " · "}
            {e.tags.map((t) => (
              <span key={t} className="tag">
                {t}
              </span>
            ))}
          </p>
          <Prose text={e.summary} />
          {writable && (
            <div className="actions">
              <button type="button" onClick={() => setEditing(true)}>
                Edit
              </button>
            </div>
          )}
        </>
      )}
    </li>
  );
}

function Entries() {
  const { role } = useSession();
  const params = useSearchParams();
  // A search hit's link opens the entries of its scope.
  const [draft, setDraft] = useState<EntrySearch>(() => ({
    search: params.get("search") ?? "",
    tags: "",
    scope: (params.get("scope") as Scope | null) ?? "",
    scopeRef: params.get("scopeRef") ?? "",
  }));
  const [query, setQuery] = useState<EntrySearch>(draft);
  const tags = tagList(query.tags);
  const entries = useQuery(EntriesDocument, {
    search: query.search.trim() || null,
    tags: tags.length ? tags : null,
    scope: query.scope || null,
    scopeRef: query.scopeRef.trim() || null,
    first: 50,
  });
  const submit = (e: FormEvent) => {
    e.preventDefault();
    setQuery(draft);
  };
  const rows = entries.data?.entries.edges ?? [];
  return (
    <section aria-labelledby="entries-title">
      <h2 id="entries-title">Entries</h2>
      <form className="filters" onSubmit={submit} aria-label="Search entries">
        <label>
          Text
          <input type="search" value={draft.search} onChange={(e) => setDraft({ ...draft, search: e.target.value })} placeholder="e.g. ROAS" />
        </label>
        <label>
          Tags
          <input value={draft.tags} onChange={(e) => setDraft({ ...draft, tags: e.target.value })} placeholder="comma, separated" />
        </label>
        <label>
          Scope
          <ScopeSelect id="entry-scope" value={draft.scope} onChange={(scope) => setDraft({ ...draft, scope })} />
        </label>
        <label>
          Scope ref
          <input value={draft.scopeRef} onChange={(e) => setDraft({ ...draft, scopeRef: e.target.value })} />
        </label>
        <button type="submit">Search</button>
      </form>
      {entries.error && <Failure error={entries.error} retry={entries.refetch} />}
      {entries.loading && !entries.data && <Loading />}
      {entries.data && rows.length === 0 && <Empty>No entries match.</Empty>}
      <ul className="cards">
        {rows.map(({ node: e }) => (
          <EntryCard key={`${e.id}:${e.updatedAt}`} entry={e} writable={canWrite(role)} onChanged={entries.refetch} />
        ))}
      </ul>
    </section>
  );
}

function Events() {
  const params = useSearchParams();
  const [scope, setScope] = useState<Scope | "">(() => (params.get("scope") as Scope | null) ?? "");
  const [scopeRef, setScopeRef] = useState(() => params.get("scopeRef") ?? "");
  const [kind, setKind] = useState("");
  const [includeCompressed, setIncludeCompressed] = useState(true);
  const [applied, setApplied] = useState({ scopeRef, kind: "" });
  const events = useQuery(EventsDocument, {
    scope: scope || null,
    scopeRef: applied.scopeRef.trim() || null,
    kind: applied.kind.trim() || null,
    includeCompressed,
    first: 50,
  });
  const rows = events.data?.events.edges ?? [];
  return (
    <section aria-labelledby="events-title">
      <h2 id="events-title">Events</h2>
      <form
        className="filters"
        aria-label="Browse events"
        onSubmit={(e) => {
          e.preventDefault();
          setApplied({ scopeRef, kind });
        }}
      >
        <label>
          Scope
          <ScopeSelect id="event-scope" value={scope} onChange={setScope} />
        </label>
        <label>
          Scope ref
          <input value={scopeRef} onChange={(e) => setScopeRef(e.target.value)} />
        </label>
        <label>
          Kind
          <input value={kind} onChange={(e) => setKind(e.target.value)} placeholder="e.g. decision" />
        </label>
        <label className="check">
          <input type="checkbox" checked={includeCompressed} onChange={(e) => setIncludeCompressed(e.target.checked)} /> include compressed
        </label>
        <button type="submit">Show</button>
      </form>
      {events.error && <Failure error={events.error} retry={events.refetch} />}
      {events.loading && !events.data && <Loading />}
      {events.data && rows.length === 0 && <Empty>No events here.</Empty>}
      {rows.length > 0 && (
        // Focusable: on a phone the table scrolls sideways inside its box, and keyboards must reach it.
        <table tabIndex={0} aria-label="Events">
          <thead>
            <tr>
              <th scope="col">When</th>
              <th scope="col">Scope</th>
              <th scope="col">Kind</th>
              <th scope="col">Body</th>
              <th scope="col">Compressed into</th>
            </tr>
          </thead>
          <tbody>
            {rows.map(({ node: e }) => (
              <tr key={e.id} className={e.compressedAt ? "folded" : undefined}>
                <td>{time(e.occurredAt)}</td>
                <td>
                  {e.scope.toLowerCase()} / {e.scopeRef}
                </td>
                <td>
                  <code>{e.kind}</code>
                </td>
                <td>
                  <Prose text={e.body} />
                </td>
                <td>{e.compressedAt ? <>{e.entry ? `“${e.entry.title}”` : "(entry forgotten)"} · {time(e.compressedAt)}</> : <span className="muted">not compressed</span>}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

export function MemoryView() {
  return (
    <section aria-labelledby="memory-title">
      <h1 id="memory-title">Entries & events</h1>
      <p className="lede">Curated entries (what context assembly reads) and the raw event log they are compacted from.</p>
      <Entries />
      <Events />
    </section>
  );
}
