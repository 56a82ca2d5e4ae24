import { z } from "zod";

// The one reader of process.env. A wrong setting stops start-up with every problem listed.

/** Node runs a timer set longer than this after 1 ms (TimeoutOverflowWarning). */
const MAX_TIMER_MS = 2_147_483_647;

/** A duration in ms that Node's timers can wait. */
const ms = () => z.coerce.number().int().max(MAX_TIMER_MS, `must be at most ${MAX_TIMER_MS} (about 24.8 days): Node's timers wait no longer`);

/** A URL Engram fetches: `localhost:8000` parses as a URL of scheme "localhost:", and would fail only when used. */
const httpUrl = () => z.string().url().regex(/^https?:\/\//i, "must be an http:// or https:// URL");

/** A comma-separated list whose every entry passes `fits`; an entry that cannot match is refused, not ignored. */
const listOf = (fits: (entry: string) => boolean, what: string) =>
  z.string().superRefine((value, context) => {
    const wrong = value.split(",").map((entry) => entry.trim()).filter((entry) => entry && !fits(entry));
    if (wrong.length) context.addIssue({ code: "custom", message: `${wrong.map((entry) => `'${entry}'`).join(", ")}: each entry must be ${what}` });
  });

/** An origin as a browser sends it: scheme, host and port, nothing after. */
function isOrigin(entry: string): boolean {
  try {
    return new URL(entry).origin === entry.replace(/\/+$/, "");
  } catch {
    return false;
  }
}

const schema = z.object({
  HOST: z.string().min(1).default("127.0.0.1"),
  PORT: z.coerce.number().int().min(0).max(65535).default(4000),
  ENGRAM_DATA_DIR: z.string().min(1).default("./.engram"),
  DATABASE_URL: z
    .string()
    .regex(/^postgres(ql)?:\/\//, "must be a postgres:// or postgresql:// URL")
    .optional(),
  REDIS_URL: z.string().regex(/^rediss?:\/\//, "must be a redis:// or rediss:// URL").optional(),
  OPENAI_API_KEY: z.string().min(1).optional(),
  OPENAI_BASE_URL: httpUrl().optional(),
  /**
   * Hosts (host or host:port, comma-separated) a tenant's model base URL may use even though they
   * are loopback, private or link-local. OPENAI_BASE_URL's own host is always allowed.
   */
  ENGRAM_MODEL_HOST_ALLOWLIST: listOf((entry) => !/[/@?#]/.test(entry), "a host or host:port, without a scheme or path (e.g. 127.0.0.1:11434)").optional(),
  ENGRAM_CHEAP_MODEL: z.string().min(1).default("gpt-4o-mini"),
  ENGRAM_COMPACTION_MODEL: z.string().min(1).default("gpt-4o"),
  /** Recall embeddings: "auto" uses OpenAI when a key or base URL is set, else the offline encoder. */
  ENGRAM_EMBEDDINGS: z.enum(["auto", "openai", "offline"]).default("auto"),
  ENGRAM_EMBEDDING_MODEL: z.string().min(1).default("text-embedding-3-small"),
  /** An external Chroma server; without it Engram runs its own under ENGRAM_DATA_DIR/chroma. */
  CHROMA_URL: httpUrl().optional(),
  /** Encrypts tenants' own model API keys at rest (AES-256-GCM); needed only when a tenant sets one. */
  ENGRAM_SECRET: z.string().min(16, "must be at least 16 characters").optional(),
  ENGRAM_MODEL_TIMEOUT_MS: ms().positive().default(60_000),
  ENGRAM_MODEL_MAX_RETRIES: z.coerce.number().int().min(0).max(10).default(2),
  /**
   * How long a request (context, recall, any GraphQL, REST or MCP call) waits on one model call in
   * all, retries included, before it answers without it: jobs keep the longer deadline above.
   */
  ENGRAM_REPLY_MODEL_TIMEOUT_MS: ms().positive().default(10_000),
  /** WebSocket bounds: open connections per API key, and subscriptions per connection. */
  ENGRAM_WS_MAX_CONNECTIONS_PER_KEY: z.coerce.number().int().positive().default(50),
  ENGRAM_WS_MAX_SUBSCRIPTIONS: z.coerce.number().int().positive().default(100),
  /** Browser origins (comma-separated, e.g. https://app.example.com) allowed to call the API; default none. */
  ENGRAM_CORS_ORIGINS: listOf(isOrigin, "an origin: scheme, host and port only (e.g. https://app.example.com)").optional(),
  /** How long an API key lookup is reused before the database is asked again (at most 1 s; 0 = every request). */
  ENGRAM_KEY_CACHE_TTL_MS: z.coerce.number().int().min(0).max(1_000).default(1_000),
  /**
   * Memory for the copies of recently searched end users' vectors that recall searches in
   * process instead of in Chroma (vectors/cache.ts); 0 turns the copies off.
   */
  ENGRAM_VECTOR_CACHE_MB: z.coerce.number().min(0).default(256),
  /** How long a copy is trusted without hearing of a change from another instance, before it is loaded again. */
  ENGRAM_VECTOR_CACHE_TTL_MS: ms().positive().default(30_000),
  /**
   * How long a vector search waits for Chroma in all, opening the collection included: past it,
   * recall answers from keywords alone (`degraded` says why) and a VECTOR-mode recall fails, so a
   * hung Chroma never holds a reply.
   */
  ENGRAM_VECTOR_SEARCH_TIMEOUT_MS: ms().positive().default(5_000),
  /**
   * The most tokens (input plus output, chat and embeddings) any tenant's model calls may spend in
   * a calendar month (UTC); a tenant may set a lower monthlyTokenBudget, never a higher one.
   */
  ENGRAM_MONTHLY_TOKEN_BUDGET: z.coerce.number().int().min(0).max(2 ** 31 - 1).optional(),
  /** Model calls (chat + embeddings) one GraphQL operation or REST call may make, over all its fields. */
  ENGRAM_MODEL_CALLS_PER_REQUEST: z.coerce.number().int().min(1).max(1_000).default(10),
  ENGRAM_JOBS: z.enum(["on", "off"]).default("on"),
  ENGRAM_JOB_POLL_MS: ms().positive().default(2_000),
  /**
   * How long a job's lock holds without a sign of life (running jobs renew it every quarter of
   * this). On PostgreSQL, the jobs a crashed worker had locked wait this long; the embedded store
   * frees them at the next start. Agenda cancels a job whose lock lapsed, and under a saturated
   * store (bench/soak) a short one lapsed before the job could even start: keep it generous.
   */
  ENGRAM_JOB_LOCK_MS: ms().min(10_000).default(600_000),
  ENGRAM_LOG_LEVEL: z.enum(["debug", "info", "warn", "error", "silent"]).default("info"),
  /** Set by npm for `npm start` / `npx engram start`: the server then exits when npm does. */
  npm_execpath: z.string().optional(),
  /** `engram mcp`: the running Engram it talks to, and the API key it uses there. */
  ENGRAM_URL: httpUrl().default("http://127.0.0.1:4000"),
  ENGRAM_API_KEY: z.string().min(1).optional(),
});

export type Env = z.infer<typeof schema>;

const SETTINGS = Object.keys(schema.shape);

/**
 * ENGRAM_* names that are not settings yet may well be set: the tests' and CI's, and the keys the
 * README has a shell hold (ENGRAM_KEY, and ENGRAM_ADMIN_KEY as the first start prints it).
 */
const NOT_SETTINGS = /^ENGRAM_(TEST_[A-Z0-9_]+|REQUIRE_BROWSER|KEY|ADMIN_KEY)$/;

/** Edit distance: how many letters to add, drop or change to turn a into b. */
function distance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    row = next;
  }
  return row[b.length];
}

// A name this close to a setting (letters added, dropped or changed) is taken for a misspelling of it.
const MISSPELT_WITHIN = 2;

/**
 * Whether two names differ by one `_`-separated part, added or dropped anywhere, each keeping a
 * part beside ENGRAM (ENGRAM_MODEL_TIMEOUT or ENGRAM_REPLY_TIMEOUT_MS for a setting with one part
 * more; a harness's ENGRAM_DIR is not ENGRAM_DATA_DIR's).
 */
function onePartApart(a: string, b: string): boolean {
  const [short, long] = [a.split("_"), b.split("_")].sort((x, y) => x.length - y.length);
  if (long.length !== short.length + 1 || short.length < 3) return false;
  return long.some((_, i) => long.filter((_, j) => j !== i).join("_") === short.join("_"));
}

/** The setting an ENGRAM_ name means when it is that setting's own name with ENGRAM_ before it (ENGRAM_PORT for PORT). */
const prefixed = (name: string) => SETTINGS.find((known) => !known.startsWith("ENGRAM_") && name === `ENGRAM_${known}`);

/**
 * The ENGRAM_* names that are not settings, each with the setting it is closest to. A misspelt
 * one would be ignored without a word, so it stops start-up; one far from every setting is
 * likely another program's (a harness's ENGRAM_DIR) and is only warned about.
 */
function unknownNames(names: string[]): { name: string; closest: string; misspelt: boolean }[] {
  return names
    .filter((name) => name.startsWith("ENGRAM_") && !SETTINGS.includes(name) && !NOT_SETTINGS.test(name))
    .map((name) => {
      const meant = prefixed(name) ?? SETTINGS.find((known) => onePartApart(name, known));
      const closest = meant ?? SETTINGS.reduce((best, known) => (distance(name, known) < distance(name, best) ? known : best));
      return { name, closest, misspelt: Boolean(meant) || distance(name, closest) <= MISSPELT_WITHIN };
    });
}

/** What start-up logs about ENGRAM_* names that are neither settings nor misspellings of one: they are ignored. */
export function ignoredNames(source: Record<string, string | undefined> = process.env): string[] {
  return unknownNames(Object.keys(source))
    .filter((unknown) => !unknown.misspelt)
    .map(({ name, closest }) => `${name} is not a setting Engram knows, and is ignored (the closest is ${closest})`);
}

export class EnvError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "EnvError";
  }
}

/** Parses a set of variables (process.env by default); empty strings count as unset. */
export function readEnv(source: Record<string, string | undefined> = process.env): Env {
  const cleaned = Object.fromEntries(
    Object.entries(source).filter(([, value]) => value !== undefined && value !== ""),
  );
  const parsed = schema.safeParse(cleaned);
  const problems = [
    ...(parsed.success ? [] : parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`)),
    ...unknownNames(Object.keys(cleaned))
      .filter((unknown) => unknown.misspelt)
      .map(({ name, closest }) => `${name}: not a setting Engram knows (did you mean ${closest}?)`),
  ];
  if (problems.length || !parsed.success) throw new EnvError(problems);
  return parsed.data;
}

/** Whether a chat model is configured: without one, model-driven features say they are off. */
export function modelsConfigured(env: Env): boolean {
  return Boolean(env.OPENAI_API_KEY || env.OPENAI_BASE_URL);
}
