import { InspectorSearchDocument, type InspectorSearchQuery, type MemoryKind } from "@gql/graphql.ts";
import { useState, type FormEvent } from "react";
import { clip, Empty, Failure, Link, Loading, Prose, time } from "../components.tsx";
import { useFilterInUrl, useQuery } from "../hooks.ts";
import { FilterBar, KindAndTimeFilters, type FeedFilter } from "./Feed.tsx";

type Hit = InspectorSearchQuery["searchMemory"][number];

const KINDS: { kind: MemoryKind; label: string }[] = [
  { kind: "FACT", label: "Facts" },
  { kind: "ENTRY", label: "Entries" },
  { kind: "EVENT", label: "Events" },
  { kind: "SNIPPET", label: "Recall snippets" },
];

const KIND_LABEL: Record<MemoryKind, string> = { FACT: "fact", ENTRY: "entry", EVENT: "event", SNIPPET: "recall snippet" };

type SearchFilter = FeedFilter & { text?: string; memoryKinds?: MemoryKind[] };

/** The search as the URL holds it: ?q=&user=&agent=&kinds=FACT,EVENT&since=&until= */
const useSearchInUrl = () =>
  useFilterInUrl<SearchFilter>(
    { text: "q", agentId: "agent", endUserId: "user", memoryKinds: "kinds", since: "since", until: "until" },
    ["memoryKinds"],
  );

const dayStart = (day: string) => new Date(`${day}T00:00:00`).toISOString();
const dayAfter = (day: string) => new Date(new Date(`${day}T00:00:00`).getTime() + 86_400_000).toISOString();

/** Where a hit lives, as links a person can follow. */
function Source({ hit }: { hit: Hit }) {
  const parts = [];
  if (hit.endUserId) parts.push(<Link key="user" to={`/users/${hit.endUserId}`}>{hit.endUserName}</Link>);
  if (hit.conversationId) {
    const at = hit.messageSeq != null ? `?message=${hit.messageSeq}` : "";
    parts.push(
      <Link key="conversation" to={`/conversations/${hit.conversationId}${at}`}>
        {hit.conversationName}
        {hit.messageSeq != null && ` #${hit.messageSeq}`}
      </Link>,
    );
  }
  if (hit.scope) {
    const query = new URLSearchParams({ scope: hit.scope, scopeRef: hit.scopeRef ?? "" });
    parts.push(
      <Link key="scope" to={`/memory?${query}`}>
        {hit.scope.toLowerCase()} / {hit.scopeRef}
      </Link>,
    );
  }
  return (
    <>
      {parts.flatMap((part, i) => (i ? [" · ", part] : [part]))}
    </>
  );
}

function Results({ filter }: { filter: SearchFilter }) {
  const text = filter.text?.trim() ?? "";
  const search = useQuery(
    InspectorSearchDocument,
    {
      text,
      endUserId: filter.endUserId ?? null,
      agentId: filter.agentId ?? null,
      kinds: filter.memoryKinds?.length ? filter.memoryKinds : null,
      since: filter.since ? dayStart(filter.since) : null,
      until: filter.until ? dayAfter(filter.until) : null,
    },
    text.length < 2,
  );
  if (text.length < 2) return <Empty>Type at least two characters: a word, a name, an id or a URL.</Empty>;
  if (search.error) return <Failure error={search.error} retry={search.refetch} />;
  if (!search.data) return <Loading />;
  const hits = search.data.searchMemory;
  if (hits.length === 0) return <Empty>Nothing in memory matches “{text}” with these filters.</Empty>;
  return (
    <>
      <p className="muted" role="status">
        {hits.length === 100 ? "The first 100 matches" : `${hits.length} ${hits.length === 1 ? "match" : "matches"}`}, best first.
      </p>
      <ul className="cards" data-testid="search-hits">
        {hits.map((hit) => (
          <li key={`${hit.kind}:${hit.id}`} className={`card hit hit-${hit.kind.toLowerCase()}`} data-kind={hit.kind}>
            <h3>
              <span className="badge">{KIND_LABEL[hit.kind]}</span> {hit.title && <>{hit.kind === "EVENT" ? <code>{hit.title}</code> : hit.title} · </>}
              <span className="muted small">
                <Source hit={hit} /> · <time dateTime={hit.at}>{time(hit.at)}</time>
              </span>
            </h3>
            {hit.kind === "ENTRY" || hit.kind === "EVENT" ? <Prose text={clip(hit.text, 600)} /> : <p className="text">{clip(hit.text, 600)}</p>}
          </li>
        ))}
      </ul>
    </>
  );
}

export function SearchView() {
  const [filter, setFilter] = useSearchInUrl();
  const [draft, setDraft] = useState(filter.text ?? "");
  const submit = (e: FormEvent) => {
    e.preventDefault();
    setFilter({ ...filter, text: draft.trim() });
  };
  return (
    <section aria-labelledby="search-title">
      <h1 id="search-title">Search memory</h1>
      <p className="lede">Facts, entries, events and recall snippets of every user, by text, with links to where each came from.</p>
      <form className="inline" role="search" onSubmit={submit} aria-label="Search memory">
        <label className="grow">
          Text
          <input type="search" value={draft} onChange={(e) => setDraft(e.target.value)} placeholder="e.g. harbour, vegetarian, ROAS" maxLength={200} />
        </label>
        <button type="submit">Search</button>
      </form>
      <FilterBar value={filter} onChange={(next) => setFilter({ ...filter, ...next })} withConversation={false} />
      <KindAndTimeFilters
        choices={KINDS}
        kinds={filter.memoryKinds ?? []}
        since={filter.since}
        until={filter.until}
        onChange={({ kinds, ...dates }) => setFilter({ ...filter, ...dates, ...(kinds && { memoryKinds: kinds }) })}
      />
      {filter.agentId && <p className="muted small">With an agent chosen, entries and events (which belong to no agent) are left out.</p>}
      <h2 className="sr-only">Results</h2>
      <Results filter={filter} />
    </section>
  );
}
