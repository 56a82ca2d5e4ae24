import { PrismaPg } from "@prisma/adapter-pg";
import pg from "pg";
import { Prisma, PrismaClient } from "./generated/prisma/client.ts";
import { getDatamodel } from "./generated/pothos-types.ts";
import { badInput } from "./errors.ts";
import { textProblem } from "./limits.ts";

export type Db = PrismaClient;

/**
 * A pg pool whose idle connections may die (a database restart, the embedded store stopping)
 * without taking the process down: pg reports that as an 'error' event, which would otherwise
 * be unhandled. The pool replaces the connection on next use.
 */
export function createPool(url: string, max: number, onError: (error: Error) => void): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max, allowExitOnIdle: true });
  pool.on("error", onError);
  // A client checked out (a transaction, Agenda's lock) when PostgreSQL ends its connection emits
  // an error no pool listener hears: unheard, it would crash the process (test/faults/store-kill).
  pool.on("connect", (client) => client.on("error", onError));
  // Ending waits for every checked-out client. One whose connection died mid-query (the store
  // killed under it) may never be handed back: past POOL_END_GRACE_MS its connection is ended.
  const clients = new Set<pg.PoolClient>();
  pool.on("connect", (client) => clients.add(client));
  pool.on("remove", (client) => clients.delete(client));
  const end = pool.end.bind(pool);
  pool.end = (async () => {
    const timer = setTimeout(() => {
      for (const client of clients) void (client as unknown as pg.Client).end().catch(() => {});
    }, POOL_END_GRACE_MS);
    try {
      await end();
    } finally {
      clearTimeout(timer);
    }
  }) as typeof pool.end;
  return pool;
}

const POOL_END_GRACE_MS = 2_000;

/** The one Prisma client of a process, always over pg + @prisma/adapter-pg. */
export function createDb(url: string, onPoolError: (error: Error) => void, poolSize = 8): Db {
  // The adapter leaves a pool it was handed open on $disconnect unless told to end it.
  const adapter = new PrismaPg(createPool(url, poolSize, onPoolError), { disposeExternalPool: true });
  return new PrismaClient({ adapter });
}

// Every model with a tenantId column is tenant-owned; derived from the schema, so a new model
// cannot be forgotten here.
const datamodel = getDatamodel().datamodel.models;
const tenantOwned = new Set(
  Object.entries(datamodel)
    .filter(([, model]) => model.fields.some((field) => field.name === "tenantId"))
    .map(([name]) => name),
);

const WHERE_OPERATIONS = new Set([
  "findUnique",
  "findUniqueOrThrow",
  "findFirst",
  "findFirstOrThrow",
  "findMany",
  "count",
  "aggregate",
  "groupBy",
  "update",
  "updateMany",
  "updateManyAndReturn",
  "delete",
  "deleteMany",
  "upsert",
]);

type Args = Record<string, unknown> & { where?: object; data?: unknown; create?: object };

/**
 * A page cursor names a row in the caller's words (Pothos decodes it from the cursor they pass,
 * typed chunks included): each value must be text the store can hold. A number or null reached
 * Prisma, a NUL the store, both as internal errors. A relation's page (`include`/`select`) too.
 * (The row itself is looked for with the query's filters, the tenant's included, so another
 * tenant's id pages nothing: test/isolation.test.ts.)
 */
function checkCursors(model: string, args: Args) {
  if (args.cursor) {
    for (const value of Object.values(args.cursor)) {
      if (typeof value !== "string" || textProblem(value)) throw badInput("The cursor names no row of this list: pass a page's endCursor or startCursor.");
    }
  }
  for (const part of [args.include, args.select]) {
    if (!part || typeof part !== "object") continue;
    for (const [name, value] of Object.entries(part)) {
      if (!value || typeof value !== "object") continue; // a scalar's `true`
      const related = datamodel[model]?.fields.find((field) => field.name === name && field.kind === "object")?.type;
      if (related) checkCursors(related, value as Args);
    }
  }
}

function scopeArgs(operation: string, args: Args, tenantId: string): Args {
  const scoped: Args = { ...args };
  if (WHERE_OPERATIONS.has(operation)) scoped.where = { ...args.where, tenantId };
  if (operation === "create") scoped.data = { ...(args.data as object), tenantId };
  if (operation === "createMany" || operation === "createManyAndReturn") {
    const rows = Array.isArray(args.data) ? args.data : [args.data];
    scoped.data = rows.map((row: object) => ({ ...row, tenantId }));
  }
  if (operation === "upsert") scoped.create = { ...args.create, tenantId };
  return scoped;
}

function scopeToTenant(db: Db, tenantId: string) {
  return db.$extends({
    name: "tenant-scope",
    client: { $tenantId: () => tenantId },
    query: {
      $allModels: {
        $allOperations({ model, operation, args, query }) {
          checkCursors(model, args as Args);
          if (!tenantOwned.has(model)) return query(args);
          return query(scopeArgs(operation, args as Args, tenantId) as typeof args);
        },
      },
    },
  });
}

/**
 * A client that can only see and write one tenant's rows: every where gets the tenant id and
 * every create is stamped with it (creates also name `tenantId: db.$tenantId()` because Prisma's
 * types require the column; the stamp overrides whatever they pass). The only place tenant
 * filtering happens. Raw SQL is not covered: raw queries take `$tenantId()` explicitly.
 */
export type TenantDb = ReturnType<typeof scopeToTenant>;

const scopedClients = new WeakMap<Db, Map<string, TenantDb>>();

export function forTenant(db: Db, tenantId: string): TenantDb {
  let clients = scopedClients.get(db);
  if (!clients) scopedClients.set(db, (clients = new Map()));
  let scoped = clients.get(tenantId);
  if (!scoped) {
    if (clients.size > 10_000) clients.clear();
    clients.set(tenantId, (scoped = scopeToTenant(db, tenantId)));
  }
  return scoped;
}

/** The tenants a cross-tenant sweep (compaction, retention, reconcile) walks, each behind its own scoped client. */
export type TenantDirectory = {
  /** The one tenant-scoped client for a tenant id. */
  scoped(tenantId: string): TenantDb;
  /** Active tenants, or just the one named; with their settings row. */
  active(tenantId?: string): Promise<{ id: string; name: string; createdAt: Date }[]>;
};

/** The PostgreSQL type of each column insertRows writes, by column name (tenantId is its own). */
export type ColumnTypes = Record<string, "text" | "integer" | "jsonb" | "timestamp(3)">;

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Inserts a tenant's rows gathered together in one raw statement, however many: they travel as
 * one JSON parameter that jsonb_to_recordset unpacks by the column types given. Each row is
 * stamped with the client's tenant. Every column the table needs must be named and every row
 * must carry it, ids and times included (from the application, as Prisma's defaults would be):
 * a column left out of a row is NULL, not the table's default, and keys not named are ignored.
 * Prisma's create and createMany run each call through its WASM query compiler (about 0.7 ms of
 * CPU an insert more than a raw statement, measured on PostgreSQL, 3,000 inserts 8 in flight),
 * and createMany adds a transaction: two statements more.
 */
export async function insertRows(db: TenantDb, table: Prisma.ModelName, columns: ColumnTypes, rows: Record<string, unknown>[]) {
  if (!rows.length) return;
  const all: ColumnTypes = { tenantId: "text", ...columns };
  const bad = Object.keys(all).find((name) => !IDENTIFIER.test(name));
  if (bad) throw new Error(`insertRows: "${bad}" is not a column name.`);
  const names = Prisma.raw(Object.keys(all).map((name) => `"${name}"`).join(", "));
  const record = Prisma.raw(Object.entries(all).map(([name, type]) => `"${name}" ${type}`).join(", "));
  const stamped = rows.map((row) => ({ ...row, tenantId: db.$tenantId() }));
  await db.$executeRaw`INSERT INTO ${Prisma.raw(`"${table}"`)} (${names})
    SELECT ${names} FROM jsonb_to_recordset(${JSON.stringify(stamped)}::jsonb) AS r(${record})`;
}

/**
 * PostgreSQL's SQLSTATE of a failed statement: Prisma's own queries report a duplicate key as
 * P2002, a raw statement's failure reaches us as P2010 with the code in the driver adapter's error.
 */
function sqlState(error: unknown): string | undefined {
  if (!(error instanceof Prisma.PrismaClientKnownRequestError)) return undefined;
  if (error.code === "P2002") return "23505";
  const meta = error.meta as { driverAdapterError?: { cause?: { originalCode?: string } } } | undefined;
  return error.code === "P2010" ? meta?.driverAdapterError?.cause?.originalCode : undefined;
}

/** A duplicate key. */
export function isUniqueViolation(error: unknown): boolean {
  return sqlState(error) === "23505";
}

/**
 * The store refused a value (SQLSTATE class 22, data exception: a NUL in text, a number out of
 * range) or a row (class 23, a constraint): the statement did nothing, and sent again it fails
 * the same way.
 */
export function isRefusedData(error: unknown): boolean {
  return /^2[23]/.test(sqlState(error) ?? "");
}

/**
 * The time a raw statement writes, from the application's clock as Prisma's `@default(now())`
 * and every `new Date()` are: with the database's `now()` instead, a database on another host
 * with a skewed clock would put rows outside the windows the worker reads by its own time (the
 * reconcile sweep's lost-vector check reads snippets indexed since it last looked).
 */
export function appNow(): Prisma.Sql {
  return sqlTimestamp(new Date());
}

/** A time of this process's clock as a raw statement's `timestamp(3)` value (the columns Prisma writes). */
export function sqlTimestamp(at: Date): Prisma.Sql {
  return Prisma.sql`${at.toISOString()}::timestamp(3)`;
}

/**
 * A row a raw statement read as `to_jsonb(t)`, typed as the model's: its DateTime fields (which
 * JSON carries as text, without a zone for `timestamp(3)`) become Dates. Every scalar the table
 * has comes along, so it answers what plugin-prisma's `include: true` of the model asks for.
 */
export function rowFromJson<T>(model: "Conversation" | "Agent" | "EndUser", json: Record<string, unknown>): T {
  const row: Record<string, unknown> = { ...json };
  for (const field of datamodel[model].fields) {
    const value = row[field.name];
    if (field.type === "DateTime" && typeof value === "string") row[field.name] = new Date(/Z|[+-]\d\d:?\d\d$/.test(value) ? value : `${value}Z`);
  }
  return row as T;
}
