import { parseArgs } from "node:util";
import type { Db } from "./db.ts";
import { EnvError, readEnv, type Env } from "./env.ts";
import { EngramError } from "./errors.ts";
import type { Services } from "./services.ts";

// Only what a command needs is loaded (dynamic imports), so `engram --help` and the key and
// tenant commands start fast.

const USAGE = `Usage: engram <command>

  start                                   run the server (npm start also sets V8's memory flags)
  mcp                                     an MCP server on stdio for a running Engram
                                          (ENGRAM_URL, default http://127.0.0.1:4000; ENGRAM_API_KEY)
  tenants list                            print each tenant: id, name, number of active keys
  tenants create <name>                   create a tenant; prints its admin key alone on stdout,
                                          and its id on stderr
  keys create --role <admin|writer|reader> [--tenant <id>] [--name <label>]
                                          create an API key; prints the key alone on stdout.
                                          Works with the server stopped: the way back in when
                                          the admin key is lost
  compact --now                           run the daily compaction now, for every tenant
  retention --now                         run the nightly retention now, for every tenant
  export-user <endUserExternalId> [--tenant <id>]
                                          everything held about one person, as JSON on stdout
  import <file.jsonl> [--tenant <id>]     backfill conversations, one JSON object per line:
                                          {agentExternalId, endUserExternalId, conversationExternalId,
                                           messages: [{role, content, occurredAt}]}

While the server runs on the embedded store, commands go through its store.`;

const quietLog = async (env: Env) => {
  const { createLogger } = await import("./log.ts");
  return createLogger(env.ENGRAM_LOG_LEVEL === "info" ? "warn" : env.ENGRAM_LOG_LEVEL);
};

/** The whole service set (models, jobs, vectors): for commands that do memory work. */
async function withServices<T>(work: (services: Services) => Promise<T>): Promise<T> {
  const env = readEnv();
  const { openServices } = await import("./services.ts");
  const services = await openServices(env, { attach: true, log: await quietLog(env) });
  try {
    return await work(services);
  } finally {
    await services.close();
  }
}

/** The database alone (the running server's store, or the folder owned for the command). */
async function withDb<T>(work: (db: Db) => Promise<T>): Promise<T> {
  const env = readEnv();
  const log = await quietLog(env);
  const [{ attachOrStartEmbeddedStore, externalStore }, { migrate }, { createDb }] = await Promise.all([
    import("./embedded/embedded.ts"),
    import("./embedded/migrate.ts"),
    import("./db.ts"),
  ]);
  const store = env.DATABASE_URL
    ? externalStore(env.DATABASE_URL)
    : await attachOrStartEmbeddedStore(env.ENGRAM_DATA_DIR, { log });
  try {
    await migrate(store.url);
    const db = createDb(store.url, (error) => log.warn("database connection lost", { error }), 2);
    try {
      return await work(db);
    } finally {
      await db.$disconnect();
    }
  } finally {
    await store.stop();
  }
}

async function resolveTenantId(db: Db, given?: string) {
  if (given) {
    if (!(await db.tenant.findUnique({ where: { id: given }, select: { id: true } }))) {
      throw new EngramError("NOT_FOUND", `Tenant ${given} was not found: \`engram tenants list\` shows them.`);
    }
    return given;
  }
  const tenants = await db.tenant.findMany({ select: { id: true, name: true }, take: 2 });
  if (tenants.length === 1) return tenants[0].id;
  throw new EngramError(
    "BAD_USER_INPUT",
    tenants.length
      ? "Several tenants exist: pass --tenant <id> (`engram tenants list` shows them)."
      : "No tenant exists yet: start Engram once or run `engram tenants create <name>`.",
  );
}

/** `engram import`: conversations from a JSONL file, with a progress bar on stderr. */
async function importFile(services: Services, file: string, tenant?: string): Promise<number> {
  const [{ countLines, importJsonl }, { afterTurnRecorded }, { forTenant }] = await Promise.all([
    import("./memory/conversations/import-file.ts"),
    import("./work/after-turn.ts"),
    import("./db.ts"),
  ]);
  const tenantId = await resolveTenantId(services.db, tenant);
  const total = await countLines(file);
  const tty = process.stderr.isTTY;
  let done = 0;
  let messages = 0;
  let failed = 0;
  const draw = () => {
    const width = 30;
    const filled = total ? Math.round((done / total) * width) : width;
    const line = `[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${done}/${total} conversations, ${messages} messages${failed ? `, ${failed} failed` : ""}`;
    if (tty) process.stderr.write(`\r${line}`);
    else if (done === total || done % Math.max(1, Math.ceil(total / 10)) === 0) process.stderr.write(`${line}\n`);
  };
  const db = forTenant(services.db, tenantId);
  const after = (imported: Parameters<typeof afterTurnRecorded>[2]) => afterTurnRecorded(db, services.deps, imported);
  for await (const result of importJsonl(db, file, after)) {
    done++;
    if (result.error) {
      failed++;
      process.stderr.write(`${tty ? "\n" : ""}line ${result.line}: ${result.error}\n`);
    } else messages += result.messages ?? 0;
    draw();
  }
  if (tty && done) process.stderr.write("\n");
  const imported = done - failed;
  process.stdout.write(
    imported
      ? `imported ${imported} of ${done} conversations (${messages} messages); summaries, fact extraction and recall indexing are queued\n`
      : `nothing imported: ${done ? `all ${done} conversations failed` : "the file has no conversations"}\n`,
  );
  return failed;
}

async function main(argv: string[]) {
  const [command, sub, ...rest] = argv;
  // bin/engram.mjs runs the server's entry (dist/main.js) for `engram start`; this file only
  // gets it when run some other way.
  if (command === "start") {
    process.stderr.write("`start` runs through bin/engram.mjs (`npx engram start`) or `npm start`, not this file.\n");
    process.exitCode = 2;
    return;
  }
  if (command === "tenants" && sub === "list") {
    const tenants = await withDb((db) =>
      db.tenant.findMany({
        orderBy: { createdAt: "asc" },
        select: { id: true, name: true, _count: { select: { apiKeys: { where: { revokedAt: null } } } } },
      }),
    );
    if (!tenants.length) process.stderr.write("no tenants yet: start Engram once or run `engram tenants create <name>`\n");
    for (const tenant of tenants) process.stdout.write(`${tenant.id}\t${tenant.name}\t${tenant._count.apiKeys} keys\n`);
    return;
  }
  if (command === "mcp") {
    const { serveMcpOverStdio } = await import("./mcp/stdio.ts");
    await serveMcpOverStdio(readEnv());
    return;
  }
  if (command === "tenants" && sub === "create") {
    const name = rest.join(" ").trim();
    if (!name) throw new EngramError("BAD_USER_INPUT", "Give the tenant a name: engram tenants create <name>");
    const { createTenant } = await import("./auth.ts");
    const { tenant, adminKey } = await withDb((db) => createTenant(db, { name }));
    process.stderr.write(`tenant ${tenant.id} (${tenant.name}); its admin key:\n`);
    process.stdout.write(`${adminKey}\n`);
    return;
  }
  if (command === "keys" && sub === "create") {
    const { values } = parseArgs({
      args: rest,
      options: { role: { type: "string" }, tenant: { type: "string" }, name: { type: "string" } },
    });
    const role = values.role?.toUpperCase();
    if (role !== "ADMIN" && role !== "WRITER" && role !== "READER") {
      throw new EngramError("BAD_USER_INPUT", "--role must be admin, writer or reader.");
    }
    const [{ createApiKey }, { forTenant }] = await Promise.all([import("./governance/keys.ts"), import("./db.ts")]);
    const { key } = await withDb(async (db) =>
      createApiKey(forTenant(db, await resolveTenantId(db, values.tenant)), { role, name: values.name ?? "" }),
    );
    process.stdout.write(`${key}\n`);
    return;
  }
  if ((command === "compact" || command === "retention") && sub === "--now") {
    const runs = await withServices(async (services) => {
      if (command === "compact") return (await import("./work/compact-tenants.ts")).compactTenants(services.deps, {});
      return (await import("./work/retention.ts")).retentionSweep(services.deps, {});
    });
    for (const run of runs) {
      process.stdout.write(`${run.tenantId} ${run.status} ${JSON.stringify(run.result ?? run.error)}\n`);
    }
    return;
  }
  if (command === "export-user" && sub) {
    const { values } = parseArgs({ args: rest, options: { tenant: { type: "string" } } });
    const [{ forTenant }, { exportUser }] = await Promise.all([import("./db.ts"), import("./memory/export.ts")]);
    const exported = await withServices(async (services) => {
      const db = forTenant(services.db, await resolveTenantId(services.db, values.tenant));
      const user = await db.endUser.findFirst({ where: { OR: [{ externalId: sub }, { id: sub }] } });
      if (!user) throw new EngramError("NOT_FOUND", `No end user ${sub} in this tenant.`);
      return exportUser(db, user.id);
    });
    process.stdout.write(`${JSON.stringify(exported, null, 2)}
`);
    return;
  }
  if (command === "import" && sub) {
    const { values } = parseArgs({ args: rest, options: { tenant: { type: "string" } } });
    const failed = await withServices((services) => importFile(services, sub, values.tenant));
    if (failed) process.exitCode = 1;
    return;
  }
  process.stderr.write(`${USAGE}\n`);
  process.exitCode = command && command !== "help" && command !== "--help" ? 2 : 0;
}

main(process.argv.slice(2)).catch((error) => {
  if (error instanceof EnvError || error instanceof EngramError || error?.name === "StoreBusyError") {
    process.stderr.write(`${error.message}\n`);
  } else {
    process.stderr.write(`${(error as Error).stack ?? error}\n`);
  }
  process.exit(1);
});
