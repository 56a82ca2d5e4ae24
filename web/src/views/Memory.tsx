import { EntriesDocument, EventsDocument, type Scope } from "@gql/graphql.ts";
import { useState, type FormEvent } from "react";
import { Empty, Failure, Loading, Prose, time } from "../components.tsx";
import { useQuery } from "../hooks.ts";

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

function Entries() {
  const [draft, setDraft] = useState<EntrySearch>({ search: "", tags: "", scope: "", scopeRef: "" });
  const [query, setQuery] = useState<EntrySearch>(draft);
  const tags = query.tags.split(",").map((t) => t.trim()).filter(Boolean);
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
          <li key={e.id} className="card">
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
          </li>
        ))}
      </ul>
    </section>
  );
}

function Events() {
  const [scope, setScope] = useState<Scope | "">("");
  const [scopeRef, setScopeRef] = useState("");
  const [kind, setKind] = useState("");
  const [includeCompressed, setIncludeCompressed] = useState(true);
  const [applied, setApplied] = useState({ scopeRef: "", kind: "" });
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
        <table>
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
