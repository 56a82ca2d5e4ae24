import type { WebSocket } from "ws";
import type { PubSub } from "./pubsub.ts";

/** Close codes a WebSocket client can act on. */
export const CLOSE = { revoked: 4401, tooManyConnections: 4429 } as const;

/**
 * The WebSocket connections of each API key: bounded per key, and closed as soon as the key is
 * revoked on any instance (revocations travel on the pubsub, through Redis when it is set).
 */
export function createSocketRegistry(pubsub: PubSub, limits: { connectionsPerKey: number }) {
  const byKey = new Map<string, Set<WebSocket>>();
  const revocations = pubsub.subscribe("apiKeyRevoked", "all");
  void (async () => {
    for await (const { apiKeyId } of revocations) {
      for (const socket of byKey.get(apiKeyId) ?? []) socket.close(CLOSE.revoked, "API key revoked");
      byKey.delete(apiKeyId);
    }
  })().catch(() => undefined);

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
      await revocations.return?.();
    },
  };
}
