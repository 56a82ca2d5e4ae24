import { ViewerDocument } from "@gql/graphql.ts";
import { useCallback, useEffect, useState, type FormEvent } from "react";
import { ApiError, Engram, onStoredKeyChange, storedKey, storeKey } from "./api.ts";
import { Link } from "./components.tsx";
import { canWrite, navigate, SessionContext, useLiveStatus, usePath, type Session } from "./hooks.ts";
import { CostsView } from "./views/Costs.tsx";
import { ConversationsView } from "./views/Conversations.tsx";
import { FeedView } from "./views/Feed.tsx";
import { MemoryView } from "./views/Memory.tsx";
import { SearchView } from "./views/Search.tsx";
import { UsersView } from "./views/Users.tsx";

async function openSession(key: string): Promise<Omit<Session, "signOut">> {
  const engram = new Engram(key);
  try {
    const { viewer } = await engram.request(ViewerDocument);
    return { engram, role: viewer.role, tenantName: viewer.tenant.name };
  } catch (error) {
    await engram.close();
    throw error;
  }
}

/** Why the page is back at sign-in, when it is not the person's own doing. */
type SignedOutReason = "refused" | "signed-out-elsewhere";

function SignIn({
  onSignedIn,
  initialError,
  reason,
}: {
  onSignedIn(session: Omit<Session, "signOut">): void;
  initialError?: ApiError;
  reason?: SignedOutReason;
}) {
  const [key, setKey] = useState("");
  const [error, setError] = useState<ApiError | undefined>(initialError);
  const [busy, setBusy] = useState(false);
  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const session = await openSession(key.trim());
      storeKey(key.trim());
      onSignedIn(session);
    } catch (failure) {
      setError(failure as ApiError);
    } finally {
      setBusy(false);
    }
  };
  return (
    <main className="signin">
      <h1>Engram inspector</h1>
      <p>Sign in with an API key. A reader key can look; a writer key can also edit facts.</p>
      <form onSubmit={submit}>
        <label htmlFor="api-key">API key</label>
        <input
          id="api-key"
          name="api-key"
          type="password"
          autoComplete="off"
          placeholder="egm_…"
          value={key}
          onChange={(e) => setKey(e.target.value)}
          required
          autoFocus
        />
        <button type="submit" disabled={busy || !key.trim()}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
      </form>
      {!error && reason && (
        <p className="failure" role="alert">
          {reason === "refused"
            ? "Your key no longer works (it was revoked, or its tenant is gone). Sign in with a valid key."
            : "You signed out in another tab."}
        </p>
      )}
      {error && (
        <p className="failure" role="alert">
          {error.kind === "unauthenticated"
            ? "That key was refused. Check it and try again."
            : error.kind === "unreachable"
              ? `${error.message} Is the server running?`
              : error.message}
        </p>
      )}
      <p className="hint">
        The key is kept in this browser's local storage for this site, shared by its tabs, and sent only to this server. Sign out
        removes it from every tab.
      </p>
    </main>
  );
}

function LiveBadge() {
  const status = useLiveStatus();
  const label =
    status === "live" ? "Live" : status === "reconnecting" ? "Reconnecting…" : status === "idle" ? "Not listening" : "Connecting…";
  return (
    <span className={`live live-${status}`} role="status" aria-live="polite" data-testid="live-status">
      {label}
    </span>
  );
}

const SECTIONS = [
  { path: "/", label: "Live feed" },
  { path: "/conversations", label: "Conversations" },
  { path: "/users", label: "Users" },
  { path: "/memory", label: "Entries & events" },
  { path: "/search", label: "Search" },
  { path: "/costs", label: "Costs & jobs" },
];

function Page() {
  const path = usePath();
  const [route] = path.split("?");
  const [, section = "", id] = route.split("/");
  const view =
    section === "conversations" ? (
      <ConversationsView id={id} />
    ) : section === "users" ? (
      <UsersView id={id} />
    ) : section === "memory" ? (
      <MemoryView />
    ) : section === "search" ? (
      <SearchView />
    ) : section === "costs" ? (
      <CostsView />
    ) : (
      <FeedView />
    );
  return (
    <>
      <header className="top">
        <span className="brand">Engram inspector</span>
        <nav aria-label="Sections">
          {SECTIONS.map((s) => (
            <Link key={s.path} to={s.path} className={`/${section}` === s.path ? "current" : undefined}>
              {s.label}
            </Link>
          ))}
        </nav>
        <LiveBadge />
        <SessionBadge />
      </header>
      <main className="content">{view}</main>
    </>
  );
}

function SessionBadge() {
  return (
    <SessionContext.Consumer>
      {(session) =>
        session && (
          <span className="who">
            {session.tenantName} · <span data-testid="role">{session.role.toLowerCase()}</span>
            {!canWrite(session.role) && " (read only)"}
            <button type="button" onClick={session.signOut}>
              Sign out
            </button>
          </span>
        )
      }
    </SessionContext.Consumer>
  );
}

export function App() {
  const [session, setSession] = useState<Omit<Session, "signOut"> | null>(null);
  const [restoring, setRestoring] = useState(() => Boolean(storedKey()));
  const [restoreError, setRestoreError] = useState<ApiError>();
  const [reason, setReason] = useState<SignedOutReason>();

  const end = useCallback((why?: SignedOutReason) => {
    setSession((current) => {
      void current?.engram.close();
      return null;
    });
    setReason(why);
    setRestoreError(undefined);
  }, []);

  const begin = useCallback(
    (opened: Omit<Session, "signOut">) => {
      // A key revoked mid-session sends the page back to sign-in, once, with one clear message.
      opened.engram.onRefused = () => {
        if (storedKey() === opened.engram.key) storeKey(null);
        end("refused");
      };
      setReason(undefined);
      setSession(opened);
    },
    [end],
  );

  const restore = useCallback(() => {
    const key = storedKey();
    if (!key) return setRestoring(false);
    setRestoring(true);
    openSession(key)
      .then(begin)
      .catch((error: ApiError) => {
        if (error.kind === "unauthenticated") {
          storeKey(null);
          setReason("refused");
        } else setRestoreError(error);
      })
      .finally(() => setRestoring(false));
  }, [begin]);
  useEffect(restore, [restore]);

  // Another tab signed in or out: follow it.
  useEffect(
    () =>
      onStoredKeyChange((key) => {
        if (!key) end("signed-out-elsewhere");
        else if (key !== session?.engram.key) restore();
      }),
    [end, restore, session],
  );

  const signOut = useCallback(() => {
    storeKey(null);
    end();
    navigate("/");
  }, [end]);

  if (restoring) return <p className="loading">Signing in…</p>;
  if (!session) {
    if (restoreError?.kind === "unreachable" && storedKey()) {
      return (
        <main className="signin">
          <h1>Engram inspector</h1>
          <p className="failure" role="alert">
            {restoreError.message} Is the server running?
          </p>
          <button type="button" onClick={restore}>
            Try again
          </button>{" "}
          <button type="button" onClick={signOut}>
            Use another key
          </button>
        </main>
      );
    }
    return <SignIn onSignedIn={begin} initialError={restoreError} reason={reason} />;
  }
  return (
    <SessionContext.Provider value={{ ...session, signOut }}>
      <Page />
    </SessionContext.Provider>
  );
}
