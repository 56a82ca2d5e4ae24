import type { IncomingMessage, ServerResponse } from "node:http";
import type { TenantDb } from "./db.ts";
import { EngramError } from "./errors.ts";
import type { Principal } from "./governance/keys.ts";
import { textProblem } from "./limits.ts";
import type { Logger } from "./log.ts";
import { KEY_SWEEP_MS } from "./sockets.ts";
import { auditExport, ExportAborted, EXPORT_PATH, findEndUser, userExport, writeExport } from "./memory/export.ts";

class ExportRevoked extends Error {}

export const isExportPath = (pathname: string) => pathname === EXPORT_PATH || pathname.startsWith(`${EXPORT_PATH}/`);

/**
 * GET /export/users/:endUserId: exportUser's document for a person of any size, streamed as it
 * is read (writeExport). Admin keys only, as exportUser; the key is checked first, as on every
 * other path. Failures before the first byte answer the REST paths' typed JSON errors; one after
 * it (the store gone mid-export) can only cut the response short, which leaves the JSON unclosed,
 * so a truncated export never parses as a whole one. Every answer carries the CORS headers yoga's
 * would (`cors`), so a browser page on a listed origin can download an export with its key.
 */
export function exportHandler(deps: {
  authenticate(authorization: string | null): Promise<Principal | null>;
  /** Whether a key is still live (not revoked, its tenant active): asked while an export streams. */
  keyIsLive(apiKeyId: string): Promise<boolean>;
  tenantDb(tenantId: string): TenantDb;
  /** The CORS headers for a request from this origin (only Vary for one not listed). */
  cors(origin: string | undefined): Record<string, string>;
  log: Logger;
}) {
  return async (req: IncomingMessage, res: ServerResponse) => {
    for (const [name, value] of Object.entries(deps.cors(req.headers.origin))) res.setHeader(name, value);
    // A browser's preflight carries no key: answered before the key check, as yoga answers one.
    if (req.method === "OPTIONS") {
      res.writeHead(204, { "content-length": "0" });
      return res.end();
    }
    const answer = (status: number, message: string, code: string, headers: Record<string, string> = {}) => {
      res.writeHead(status, { "content-type": "application/json; charset=utf-8", ...headers });
      res.end(JSON.stringify({ errors: [{ message, extensions: { code } }] }));
    };
    const unexpected = (error: unknown) => {
      deps.log.error("export failed", { error });
      answer(500, "Unexpected error.", "INTERNAL_SERVER_ERROR");
    };
    let caller: Principal | null;
    try {
      caller = await deps.authenticate(req.headers.authorization ?? null);
    } catch (error) {
      return unexpected(error);
    }
    if (!caller) {
      return answer(401, "A valid API key is required: send `Authorization: Bearer <key>`.", "UNAUTHENTICATED", { "www-authenticate": 'Bearer realm="engram"' });
    }
    if (caller.role !== "ADMIN") return answer(403, "Exporting what Engram holds about a person takes an admin key.", "FORBIDDEN");
    if (req.method !== "GET") return answer(405, `${req.method} is not allowed on ${EXPORT_PATH}/<endUserId>; it takes GET.`, "METHOD_NOT_ALLOWED", { allow: "GET, OPTIONS" });
    const segment = (req.url ?? "").split("?")[0].slice(EXPORT_PATH.length + 1);
    let endUserId = "";
    try {
      endUserId = decodeURIComponent(segment);
    } catch {
      // A malformed escape names no one: answered as the empty id below.
    }
    // An id that could not be stored (a NUL, a lone surrogate) names no one either.
    if (!endUserId || segment.includes("/") || textProblem(endUserId)) return answer(404, `An export is GET ${EXPORT_PATH}/<endUserId>.`, "NOT_FOUND");

    const db = deps.tenantDb(caller.tenantId);
    let user: Awaited<ReturnType<typeof findEndUser>>;
    try {
      user = await findEndUser(db, endUserId);
      await auditExport(db, user, { apiKeyId: caller.apiKeyId, via: "stream" });
    } catch (error) {
      if (error instanceof EngramError) return answer(404, error.message, error.code);
      return unexpected(error);
    }
    res.writeHead(200, {
      "content-type": "application/json; charset=utf-8",
      "cache-control": "no-store",
      "content-disposition": `attachment; filename="engram-export-${user.id}.json"`,
    });
    // A key revoked while its export streams stops it at the next chunk, as a revocation ends a
    // subscription: looked up at most every KEY_SWEEP_MS, so within about a second of it.
    const apiKeyId = caller.apiKeyId;
    let checkedAt = performance.now();
    const keyStillLive = async () => {
      if (performance.now() - checkedAt < KEY_SWEEP_MS) return;
      checkedAt = performance.now();
      if (!(await deps.keyIsLive(apiKeyId))) throw new ExportRevoked();
    };
    try {
      await writeExport(userExport(db, user), res, keyStillLive);
      res.end();
    } catch (error) {
      if (error instanceof ExportRevoked) deps.log.info("export cut short: its API key was revoked", { endUserId, apiKeyId });
      else if (error instanceof ExportAborted) deps.log.info("export ended early: its client went away", { endUserId });
      else deps.log.error("export failed while streaming; its response was cut short", { endUserId, error });
      res.destroy();
    }
  };
}
