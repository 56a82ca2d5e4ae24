import type { WebSocket } from "ws";
import type { PubSub } from "./pubsub.ts";

/** Close codes a WebSocket client can act on. */
export const CLOSE = { revoked: 4401, tooManyConnections: 4429 } as const;

/** How often open sockets' keys are checked against the store, in case an announcement was lost. */
export const KEY_SWEEP_MS = 500;

/**
 * The WebSocket connections of each API key: bounded per key, and closed as soon as the key is
 * revoked on any instance (revocations travel on the pubsub, through Redis when it is set). An
 * announcement can be lost (Redis down, or no Redis between instances), so every KEY_SWEEP_MS the
 * keys with open sockets are also checked in one statement: a revoked key loses its sockets
 * within about a second on every instance even then.
 */
export function createSocketRegistry(
  pubsub: Pick<PubSub, "subscribe">,
  limits: { connectionsPerKey: number },
  /** Of the given key ids, those still valid (not revoked, tenant active). */
  liveKeyIds: (ids: string[]) => Promise<string[]>,
  log: { warn(message: string, fields?: Record<string, unknown>): void },
) {
  const byKey = new Map<string, Set<WebSocket>>();
  const closeKey = (apiKeyId: string) => {
    for (const socket of byKey.get(apiKeyId) ?? []) socket.close(CLOSE.revoked, "API key revoked");
    byKey.delete(apiKeyId);
  };
  const revocations = pubsub.subscribe("apiKeyRevoked", "all");
  void (async () => {
    for await (const { apiKeyId } of revocations) closeKey(apiKeyId);
  })().catch(() => undefined);

  let sweeping = false;
  const sweep = setInterval(() => {
    if (sweeping || byKey.size === 0) return;
    sweeping = true;
    const ids = [...byKey.keys()];
    liveKeyIds(ids)
      .then((live) => {
        const valid = new Set(live);
        for (const id of ids) if (!valid.has(id)) closeKey(id);
      })
      // The store being down closes nothing: the next sweep tries again.
      .catch((error: unknown) => log.warn("could not check the keys of open WebSockets", { error }))
      .finally(() => (sweeping = false));
  }, KEY_SWEEP_MS);
  sweep.unref();

  return {
    /** Registers a socket for a key; false (and the socket closed) when the key has too many. */
    add(apiKeyId: string, socket: WebSocket): boolean {
      const sockets = byKey.get(apiKeyId) ?? new Set<WebSocket>();
      if (sockets.size >= limits.connectionsPerKey) {
        socket.close(CLOSE.tooManyConnections, `Too many connections for this API key (at most ${limits.connectionsPerKey})`);
        return false;
      }
      sockets.add(socket);
      byKey.set(apiKeyId, sockets);
      socket.once("close", () => {
        sockets.delete(socket);
        if (sockets.size === 0 && byKey.get(apiKeyId) === sockets) byKey.delete(apiKeyId);
      });
      return true;
    },
    async close() {
      clearInterval(sweep);
      await revocations.return?.();
    },
  };
}
