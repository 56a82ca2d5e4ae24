import net from "node:net";
import { buildApp, type App } from "../../src/app.ts";
import { readEnv } from "../../src/env.ts";
import { createLogger } from "../../src/log.ts";
import { openServices, type Services } from "../../src/services.ts";
import type { TestEngram } from "./engram.ts";
import { redisUrl } from "./store.ts";

export const DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379";

/** Whether a Redis server answers PING at url, within a short deadline. */
export function redisAnswers(url: string, timeoutMs = 2_000): Promise<boolean> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const socket = net.connect({ host: hostname || "127.0.0.1", port: Number(port || 6379) });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once("error", () => done(false));
    socket.once("connect", () => socket.write("PING\r\n"));
    socket.once("data", (data) => done(/^\+PONG|^-NOAUTH/.test(data.toString())));
  });
}

/**
 * The Redis for cross-instance tests: ENGRAM_TEST_REDIS_URL when set, else a local Redis on the
 * default port when one answers. Without either the test fails and says how to provide one,
 * rather than passing without having checked anything.
 */
export async function testRedisUrl(): Promise<string> {
  const url = redisUrl ?? DEFAULT_TEST_REDIS_URL;
  if (await redisAnswers(url)) return url;
  throw new Error(
    `No Redis answers at ${url}. Cross-instance subscriptions need one: start Redis locally ` +
      "or set ENGRAM_TEST_REDIS_URL=redis://host:port.",
  );
}

export type TestInstance = { services: Services; app: App; url: string; stop(): Promise<void> };

/**
 * Another API instance on the same store as `first`: on PostgreSQL a second client of the same
 * database; on the embedded store it goes through the first instance's store (attach), as the
 * embedded store has one owner process.
 */
export async function startSecondInstance(
  first: TestEngram,
  env: Record<string, string> = {},
  options: { clock?: () => number } = {},
): Promise<TestInstance> {
  const parsed = readEnv({
    ENGRAM_LOG_LEVEL: process.env.ENGRAM_TEST_LOG_LEVEL ?? "error",
    ...first.store.vars,
    ...env,
  });
  const services = await openServices(parsed, { attach: true, log: createLogger(parsed.ENGRAM_LOG_LEVEL), clock: options.clock });
  const app = buildApp(services);
  const url = await app.start(0, "127.0.0.1");
  return {
    services,
    app,
    url,
    async stop() {
      await app.stop();
      await services.close();
    },
  };
}
