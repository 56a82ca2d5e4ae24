import { parseArgs } from "node:util";
import type { Db } from "./db.ts";
import { EnvError, readEnv, type Env } from "./env.ts";
import { EngramError, publicReason } from "./errors.ts";
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
                                          (one line a tenant; exit code 1 when a tenant's run failed)
  export-user <endUserExternalId> [--tenant <id>]
                                          everything held about one person, as JSON on stdout
                                          (by external id; by Engram's id when no one has that
                                          external id)
  import <file.jsonl> [--tenant <id>]     backfill conversations, one JSON object per line:
                                          {agentExternalId, endUserExternalId, conversationExternalId,
                                           messages: [{role, content, occurredAt}]}

While the server runs on the embedded store, commands go through its store.`;

const quietLog = async (env: Env) => {
  const { createLogger } = await import("./log.ts");
  return createLogger(env.ENGRAM_LOG_LEVEL === "info" ? "warn" : env.ENGRAM_LOG_LEVEL);
};

/**
 * Refuses a command that reads what a store holds where there is no embedded store: run from
 * another folder, the default ./.engram is a new, empty one, which would be made only to say
 * "no tenants yet" (or to take a tenant meant for the real one).
 */
async function requireStore(env: Env) {
  if (env.DATABASE_URL) return;
  const [{ existsSync }, path] = await Promise.all([import("node:fs"), import("node:path")]);
  const dir = path.resolve(env.ENGRAM_DATA_DIR);
  if (existsSync(path.join(dir, "pg"))) return;
  throw new EngramError(
    "NOT_FOUND",
    `No Engram store in ${dir} (ENGRAM_DATA_DIR; its default, ./.engram, is in the current folder): run this in the folder Engram runs in, or set ENGRAM_DATA_DIR.`,
  );
}

/** The whole service set (models, jobs, vectors): for commands that do memory work. */
async function withServices<T>(work: (services: Services) => Promise<T>): Promise<T> {
  const env = readEnv();
  await requireStore(env);
  const { openServices } = await import("./services.ts");
  const services = await openServices(env, { attach: true, log: await quietLog(env) });
  try {
    return await work(services);
  } finally {
    await services.close();
  }
}

/** The database alone (the running server's store, or the folder owned for the command); `create`: a new store may be made. */
async function withDb<T>(work: (db: Db) => Promise<T>, { create = false } = {}): Promise<T> {
  const env = readEnv();
  if (!create) await requireStore(env);
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
  // `--tenant=$TENANT` with the variable unset: not "the only tenant", which would act on it silently.
  if (given !== undefined && !given.trim()) throw new EngramError("BAD_USER_INPUT", "--tenant is empty: give a tenant's id (`engram tenants list` shows them).");
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
  let already = 0;
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
    } else if (result.already) already++;
    else messages += result.messages ?? 0;
    draw();
  }
  if (tty && done) process.stderr.write("\n");
  const imported = done - failed - already;
  const before = already ? `${already} of ${done} conversations were imported before and are left as they were` : "";
  process.stdout.write(
    imported
      ? `imported ${imported} of ${done} conversations (${messages} messages); summaries, fact extraction and recall indexing are queued${before ? `; ${before}` : ""}\n`
      : `nothing imported: ${before || (done ? `all ${done} conversations failed` : "the file has no conversations")}${before && failed ? `, ${failed} failed` : ""}\n`,
  );
  return failed;
}

/** A command line that does not fit its command's usage: one line, the usage, exit code 2. */
class UsageError extends Error {
  constructor(
    readonly command: string,
    message: string,
  ) {
    super(message);
    this.name = "UsageError";
  }
}

/** The commands, as their words; each is matched before its arguments are read. */
const COMMANDS = ["tenants list", "tenants create", "keys create", "compact", "retention", "export-user", "import", "mcp"] as const;
type CommandName = (typeof COMMANDS)[number];

/** A command's own lines of USAGE (its line and the lines indented under it). */
function usageOf(command: string): string {
  const lines = USAGE.split("\n");
  const first = lines.findIndex((line) => line.startsWith(`  ${command} `) || line === `  ${command}`);
  if (first < 0) return USAGE;
  let last = first + 1;
  while (last < lines.length && /^ {4,}/.test(lines[last])) last++;
  return `Usage: engram ${lines.slice(first, last).join("\n").slice(2)}`;
}

type Options = Record<string, { type: "string" | "boolean" }>;
type Values<O extends Options> = { [K in keyof O]?: O[K]["type"] extends "boolean" ? boolean : string };

/**
 * A command's arguments, strictly: an unknown option, a missing value or a wrong number of
 * arguments is a UsageError, and so is an argument starting with "-" (a name or id never does:
 * `tenants create --help` once made a tenant named "--help"). Null when --help was asked for:
 * the command's usage is printed, and nothing is opened.
 */
function parseCommand<O extends Options>(command: CommandName, args: string[], options: O, positionals: { min: number; max: number }) {
  let parsed;
  try {
    parsed = parseArgs({ args, options: { ...options, help: { type: "boolean", short: "h" } }, allowPositionals: true, strict: true });
  } catch (error) {
    const { code, message } = error as { code?: string; message: string };
    if (code?.startsWith("ERR_PARSE_ARGS_")) throw new UsageError(command, message.split("\n")[0].split(". ")[0]);
    throw error;
  }
  if ((parsed.values as { help?: boolean }).help) {
    process.stderr.write(`${usageOf(command)}\n`);
    return null;
  }
  const given = parsed.positionals;
  const dashed = given.find((arg) => arg.startsWith("-"));
  if (dashed !== undefined) throw new UsageError(command, `'${dashed}' is not an option of this command, nor a name or id (they never start with '-')`);
  if (given.length < positionals.min) throw new UsageError(command, `${/<[^>]+>/.exec(usageOf(command))?.[0] ?? "an argument"} is missing`);
  if (given.length > positionals.max) throw new UsageError(command, `unexpected argument '${given[positionals.max]}'`);
  return { values: parsed.values as Values<O>, positionals: given };
}

async function run(command: CommandName, args: string[]) {
  const none = { min: 0, max: 0 };
  const one = { min: 1, max: 1 };
  if (command === "tenants list") {
    if (!parseCommand(command, args, {}, none)) return;
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
    if (!parseCommand(command, args, {}, none)) return;
    const { serveMcpOverStdio } = await import("./mcp/stdio.ts");
    await serveMcpOverStdio(readEnv());
    return;
  }
  if (command === "tenants create") {
    // The name's words may come unquoted: `engram tenants create Acme Corp`.
    const parsed = parseCommand(command, args, {}, { min: 1, max: Infinity });
    if (!parsed) return;
    const name = parsed.positionals.join(" ").trim();
    if (!name) throw new UsageError(command, "give the tenant a name");
    const { createTenant } = await import("./auth.ts");
    const { tenant, adminKey } = await withDb((db) => createTenant(db, { name }), { create: true });
    process.stderr.write(`tenant ${tenant.id} (${tenant.name}); its admin key:\n`);
    process.stdout.write(`${adminKey}\n`);
    return;
  }
  if (command === "keys create") {
    const parsed = parseCommand(command, args, { role: { type: "string" }, tenant: { type: "string" }, name: { type: "string" } }, none);
    if (!parsed) return;
    const { values } = parsed;
    const role = values.role?.toUpperCase();
    if (role !== "ADMIN" && role !== "WRITER" && role !== "READER") throw new UsageError(command, "--role must be admin, writer or reader");
    const [{ createApiKey }, { forTenant }] = await Promise.all([import("./governance/keys.ts"), import("./db.ts")]);
    const { key } = await withDb(async (db) =>
      createApiKey(forTenant(db, await resolveTenantId(db, values.tenant)), { role, name: values.name ?? "" }, { apiKeyId: null, via: "cli" }),
    );
    process.stdout.write(`${key}\n`);
    return;
  }
  if (command === "compact" || command === "retention") {
    const parsed = parseCommand(command, args, { now: { type: "boolean" } }, none);
    if (!parsed) return;
    if (!parsed.values.now) throw new UsageError(command, "--now is needed (the scheduled run needs no command)");
    const { done, failed } = await withServices(async (services) =>
      command === "compact"
        ? (await import("./work/compact-tenants.ts")).compactTenants(services.deps, {})
        : (await import("./work/retention.ts")).retentionSweep(services.deps, {}),
    );
    for (const run of done) process.stdout.write(`${run.tenantId} ${run.status} ${JSON.stringify(run.result ?? run.error)}\n`);
    // A run that threw is FAILED in jobRuns too, where one could be written; the whole error is in the log.
    for (const { tenantId, error } of failed) process.stdout.write(`${tenantId} FAILED ${JSON.stringify(publicReason(error))}\n`);
    // A cron line or a script running this learns of a tenant's failed run from the exit code, as from import's.
    if (failed.length || done.some((run) => run.status === "FAILED")) process.exitCode = 1;
    return;
  }
  if (command === "export-user") {
    const parsed = parseCommand(command, args, { tenant: { type: "string" } }, one);
    if (!parsed) return;
    const [who] = parsed.positionals;
    const [{ forTenant }, { auditExport, endUserNamed, userExport, writeExport }] = await Promise.all([import("./db.ts"), import("./memory/export.ts")]);
    await withServices(async (services) => {
      const db = forTenant(services.db, await resolveTenantId(services.db, parsed.values.tenant));
      // Trimmed as recordTurn takes an external id, so " bob" is the bob it recorded.
      const user = await endUserNamed(db, who.trim());
      if (!user) throw new EngramError("NOT_FOUND", `No end user ${who} in this tenant.`);
      await auditExport(db, user, { apiKeyId: null, via: "cli" });
      // Streamed, a page at a time, as the HTTP export is: a long history never sits in memory.
      await writeExport(userExport(db, user), process.stdout);
    });
    process.stdout.write("\n");
    return;
  }
  if (command === "import") {
    const parsed = parseCommand(command, args, { tenant: { type: "string" } }, one);
    if (!parsed) return;
    const failed = await withServices((services) => importFile(services, parsed.positionals[0], parsed.values.tenant));
    if (failed) process.exitCode = 1;
  }
}

async function main(argv: string[]) {
  // bin/engram.mjs runs the server's entry (dist/main.js) for `engram start`; this file only
  // gets it when run some other way.
  if (argv[0] === "start") {
    process.stderr.write("`start` runs through bin/engram.mjs (`npx engram start`) or `npm start`, not this file.\n");
    process.exitCode = 2;
    return;
  }
  const command = COMMANDS.find((name) => name.split(" ").every((word, i) => argv[i] === word));
  if (command) return run(command, argv.slice(command.split(" ").length));
  const askedForHelp = !argv.length || argv[0] === "help" || argv.includes("--help") || argv.includes("-h");
  if (!askedForHelp) {
    const named = argv.slice(0, 2).filter((arg) => !arg.startsWith("-")).join(" ") || argv[0];
    process.stderr.write(`engram: '${named}' is not a command\n`);
  }
  process.stderr.write(`${USAGE}\n`);
  process.exitCode = askedForHelp ? 0 : 2;
}

// A reader that stops early (`engram export-user … | head`) closes the pipe: that ends the
// command quietly, as it ends any Unix tool, not with a stack trace.
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code === "EPIPE") process.exit(0);
  throw error;
});

main(process.argv.slice(2)).catch((error) => {
  if (error instanceof UsageError) {
    process.stderr.write(`engram ${error.command}: ${error.message}\n${usageOf(error.command)}\n`);
    process.exit(2);
  }
  if (error instanceof EnvError || error instanceof EngramError || ["StoreBusyError", "StoreSecretError", "DataFolderError"].includes(error?.name)) {
    process.stderr.write(`${error.message}\n`);
  } else {
    process.stderr.write(`${(error as Error).stack ?? error}\n`);
  }
  process.exit(1);
});
