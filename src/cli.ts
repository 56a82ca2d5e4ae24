import { parseArgs } from "node:util";
import { forTenant } from "./db.ts";
import { exportUser } from "./memory/export.ts";
import { afterTurnRecorded } from "./work/after-turn.ts";
import { compactTenants } from "./work/compact-tenants.ts";
import { retentionSweep } from "./work/retention.ts";
import { countLines, importJsonl } from "./memory/conversations/import-file.ts";
import { EnvError, readEnv } from "./env.ts";
import { EngramError } from "./errors.ts";
import { createLogger } from "./log.ts";
import { createTenant } from "./auth.ts";
import { createApiKey } from "./governance/keys.ts";
import { openServices, type Services } from "./services.ts";
import { StoreBusyError } from "./embedded/embedded.ts";

const USAGE = `Usage: engram <command>

  start                                   run the server (same as npm start)
  mcp                                     an MCP server on stdio for a running Engram
                                          (ENGRAM_URL, default http://127.0.0.1:4000; ENGRAM_API_KEY)
  tenants create <name>                   create a tenant; prints its admin key alone on stdout
  keys create --role <admin|writer|reader> [--tenant <id>] [--name <label>]
                                          create an API key; prints the key alone on stdout
  compact --now                           run the daily compaction now, for every tenant
  retention --now                         run the nightly retention now, for every tenant
  export-user <endUserExternalId> [--tenant <id>]
                                          everything held about one person, as JSON on stdout
  import <file.jsonl> [--tenant <id>]     backfill conversations, one JSON object per line:
                                          {agentExternalId, endUserExternalId, conversationExternalId,
                                           messages: [{role, content, occurredAt}]}

While the server runs on the embedded store, commands go through its store.`;

async function withServices<T>(work: (services: Services) => Promise<T>): Promise<T> {
  const env = readEnv();
  const log = createLogger(env.ENGRAM_LOG_LEVEL === "info" ? "warn" : env.ENGRAM_LOG_LEVEL);
  const services = await openServices(env, { attach: true, log });
  try {
    return await work(services);
  } finally {
    await services.close();
  }
}

async function resolveTenantId(services: Services, given?: string) {
  if (given) return given;
  const tenants = await services.db.tenant.findMany({ select: { id: true, name: true }, take: 2 });
  if (tenants.length === 1) return tenants[0].id;
  throw new EngramError(
    "BAD_USER_INPUT",
    tenants.length ? "Several tenants exist: pass --tenant <id>." : "No tenant exists yet: start Engram once or run `engram tenants create <name>`.",
  );
}

/** `engram import`: conversations from a JSONL file, with a progress bar on stderr. */
async function importFile(services: Services, file: string, tenant?: string): Promise<number> {
  const tenantId = await resolveTenantId(services, tenant);
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
  if (tty) process.stderr.write("\n");
  process.stdout.write(`imported ${done - failed} of ${done} conversations (${messages} messages); summaries, fact extraction and recall indexing are queued\n`);
  return failed;
}

async function main(argv: string[]) {
  const [command, sub, ...rest] = argv;
  if (command === "start") {
    await import("./main.ts");
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
    const { adminKey } = await withServices((services) => createTenant(services.db, { name }));
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
    const { key } = await withServices(async (services) => {
      const tenantId = await resolveTenantId(services, values.tenant);
      if (!(await services.db.tenant.findUnique({ where: { id: tenantId } }))) {
        throw new EngramError("NOT_FOUND", `Tenant ${tenantId} was not found.`);
      }
      return createApiKey(forTenant(services.db, tenantId), { role, name: values.name ?? "" });
    });
    process.stdout.write(`${key}\n`);
    return;
  }
  if (command === "compact" && sub === "--now") {
    const runs = await withServices((services) => compactTenants(services.deps, {}));
    for (const run of runs) {
      process.stdout.write(`${run.tenantId} ${run.status} ${JSON.stringify(run.result ?? run.error)}\n`);
    }
    return;
  }
  if (command === "retention" && sub === "--now") {
    const runs = await withServices((services) => retentionSweep(services.deps, {}));
    for (const run of runs) {
      process.stdout.write(`${run.tenantId} ${run.status} ${JSON.stringify(run.result ?? run.error)}\n`);
    }
    return;
  }
  if (command === "export-user" && sub) {
    const { values } = parseArgs({ args: rest, options: { tenant: { type: "string" } } });
    const exported = await withServices(async (services) => {
      const db = forTenant(services.db, await resolveTenantId(services, values.tenant));
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
  if (error instanceof EnvError || error instanceof EngramError || error instanceof StoreBusyError) {
    process.stderr.write(`${error.message}\n`);
  } else {
    process.stderr.write(`${(error as Error).stack ?? error}\n`);
  }
  process.exit(1);
});
