import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { createContext, useCallback, useContext, useEffect, useRef, useState, useSyncExternalStore } from "react";
import type { ApiError, Engram, LiveStatus } from "./api.ts";
import type { Role } from "@gql/graphql.ts";
import { INSPECTOR_ROOT } from "./root.ts";

export type Session = { engram: Engram; role: Role; tenantName: string; signOut(): void };

export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) throw new Error("useSession outside a signed-in page");
  return session;
}

export const canWrite = (role: Role) => role === "WRITER" || role === "ADMIN";

export type QueryState<T> = { data?: T; error?: ApiError; loading: boolean; refetch(): void };

/** A query that reruns when its variables change, and on refetch(); the last data stays while it reloads. */
export function useQuery<T, V>(document: TypedDocumentNode<T, V>, variables: V, skip = false): QueryState<T> {
  const { engram } = useSession();
  const [state, setState] = useState<{ data?: T; error?: ApiError; loading: boolean }>({ loading: !skip });
  const [tick, setTick] = useState(0);
  const key = JSON.stringify(variables);
  useEffect(() => {
    if (skip) return;
    let current = true;
    setState((s) => ({ ...s, loading: true }));
    engram
      .request(document, JSON.parse(key) as V)
      .then((data) => current && setState({ data, loading: false }))
      .catch((error: ApiError) => current && setState((s) => ({ data: s.data, error, loading: false })));
    return () => {
      current = false;
    };
  }, [engram, document, key, tick, skip]);
  const refetch = useCallback(() => setTick((n) => n + 1), []);
  return { ...state, refetch };
}

/** A page of a connection, as a list view reads it. */
export type Page<N> = { nodes: N[]; endCursor: string | null; hasNextPage: boolean };

/**
 * A list read a page at a time: the first page from `useQuery`, the next ones appended by
 * `loadMore` (a list that stopped at its first page hid everything after it). Variables other
 * than the cursor that change start the list again.
 */
export function usePaged<T, V extends { after?: string | null }, N extends { id: string }>(
  document: TypedDocumentNode<T, V>,
  variables: Omit<V, "after">,
  pageOf: (data: T) => Page<N>,
) {
  const { engram } = useSession();
  const first = useQuery(document, { ...variables, after: null } as V);
  const key = JSON.stringify(variables);
  const [more, setMore] = useState<{ key: string } & Page<N>>();
  const [loading, setLoading] = useState(false);
  const [error, setError] = useState<ApiError>();
  // Pages loaded for other variables are dropped, not kept for when they come back.
  useEffect(() => setMore((m) => (m?.key === key ? m : undefined)), [key]);
  const firstPage = first.data ? pageOf(first.data) : undefined;
  const extra = more?.key === key ? more : undefined;
  // A row that moved between pages while they were read (its activity reordered the list) is
  // shown once, where it was first read.
  const seen = new Set<string>();
  const nodes = [...(firstPage?.nodes ?? []), ...(extra?.nodes ?? [])].filter((node) => !seen.has(node.id) && seen.add(node.id));
  const next = extra ?? firstPage;
  const loadMore = async () => {
    setLoading(true);
    try {
      const page = pageOf(await engram.request(document, { ...variables, after: next?.endCursor ?? null } as V));
      setMore({ key, nodes: [...(extra?.nodes ?? []), ...page.nodes], endCursor: page.endCursor, hasNextPage: page.hasNextPage });
      setError(undefined);
    } catch (failure) {
      setError(failure as ApiError);
    } finally {
      setLoading(false);
    }
  };
  return { first, nodes, hasMore: Boolean(next?.hasNextPage), loadMore, loading, error };
}

/** Subscribes while mounted (and while the variables stay the same). */
export function useSubscription<T, V>(
  document: TypedDocumentNode<T, V>,
  variables: V,
  onData: (data: T) => void,
  onError?: (error: ApiError) => void,
) {
  const { engram } = useSession();
  const handlers = useRef({ onData, onError });
  handlers.current = { onData, onError };
  const key = JSON.stringify(variables);
  useEffect(
    () =>
      engram.subscribe(document, JSON.parse(key) as V, {
        next: (data) => handlers.current.onData(data),
        error: (error) => handlers.current.onError?.(error),
      }),
    [engram, document, key],
  );
}

/** Calls `fn` when the live socket is back after a loss: what it announced meanwhile must be read again. */
export function useResync(fn: () => void) {
  const { engram } = useSession();
  const latest = useRef(fn);
  latest.current = fn;
  useEffect(() => engram.onResync(() => latest.current()), [engram]);
}

export function useLiveStatus(): LiveStatus {
  const { engram } = useSession();
  return useSyncExternalStore(
    (listener) => engram.onLiveStatus(listener),
    () => engram.liveStatus,
  );
}

/** Calls `fn` at most once per `ms`, trailing. */
export function useThrottled(fn: () => void, ms: number) {
  const timer = useRef<ReturnType<typeof setTimeout> | null>(null);
  const latest = useRef(fn);
  latest.current = fn;
  useEffect(() => () => void (timer.current && clearTimeout(timer.current)), []);
  return useCallback(() => {
    if (timer.current) return;
    timer.current = setTimeout(() => {
      timer.current = null;
      latest.current();
    }, ms);
  }, [ms]);
}

// Path routing under the inspector's root (/inspector/, or below a proxy's prefix), so links can
// be opened and shared; the server falls back to index.html for any path below it.
const BASE = INSPECTOR_ROOT.pathname.replace(/\/$/, "");
const listeners = new Set<() => void>();
window.addEventListener("popstate", () => listeners.forEach((l) => l()));

export function navigate(path: string) {
  window.history.pushState(null, "", `${BASE}${path}`);
  listeners.forEach((l) => l());
  window.scrollTo(0, 0);
}

export function usePath(): string {
  const pathname = useSyncExternalStore(
    (listener) => {
      listeners.add(listener);
      return () => void listeners.delete(listener);
    },
    () => window.location.pathname + window.location.search,
  );
  return pathname.startsWith(BASE) ? pathname.slice(BASE.length) || "/" : "/";
}

export const href = (path: string) => `${BASE}${path}`;

/** The page's query string, which holds a view's filters so a link or a reload keeps them. */
export function useSearchParams(): URLSearchParams {
  const path = usePath();
  return new URLSearchParams(path.split("?")[1] ?? "");
}

type UrlFilter = Record<string, string | string[] | undefined>;

/**
 * A view's filter kept in the query string: each field under its parameter's name (`names`),
 * the fields in `lists` as comma-separated lists. Returns the filter and its setter.
 */
export function useFilterInUrl<F extends UrlFilter>(names: { [K in keyof F]?: string }, lists: (keyof F)[] = []): [F, (next: F) => void] {
  const params = useSearchParams();
  const fields = Object.entries(names) as [keyof F & string, string][];
  const filter = Object.fromEntries(
    fields.map(([field, name]) => {
      const value = params.get(name) ?? undefined;
      return [field, lists.includes(field) ? value?.split(",").filter(Boolean) : value];
    }),
  ) as F;
  const set = (next: F) =>
    setSearchParams(
      new URLSearchParams(
        fields.map(([field, name]) => {
          const value = next[field] as string | string[] | undefined;
          return [name, Array.isArray(value) ? value.join(",") : (value ?? "")];
        }),
      ),
    );
  return [filter, set];
}

/** Replaces the query string (a filter change is not a new page in the history). */
export function setSearchParams(params: URLSearchParams) {
  for (const [key, value] of [...params]) if (!value) params.delete(key);
  const query = params.toString();
  window.history.replaceState(null, "", `${window.location.pathname}${query ? `?${query}` : ""}`);
  listeners.forEach((l) => l());
}
