import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngramError } from "../src/errors.ts";
import { createEngramPubSub, SUBSCRIBER_BACKLOG_MAX } from "../src/pubsub.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

// A subscriber that reads slower than events come (each event is re-read from the store before
// it is sent) had them wait in yoga's repeater, whose 1,025th waiting push throws: inside publish,
// from an EventTarget listener, so the whole server exited (seen with one eventAppended
// subscriber and 20 appenders: 1,790 of 3,000 appends failed, /healthz refused).

const APPEND = `mutation { appendEvent(input: { scope: PROJECT, scopeRef: "burst", kind: "note", body: "Burst.", source: "test" }) { id } }`;
const FEED = `subscription { eventAppended(scope: PROJECT, scopeRef: "burst") { id body } }`;

describe("a subscriber that falls behind", () => {
  it("is ended with SUBSCRIBER_TOO_SLOW after what waited for it, and publish does not throw", async () => {
    const pubsub = createEngramPubSub();
    const events = pubsub.subscribe("eventAppended", "tenant-a")[Symbol.asyncIterator]();
    const first = events.next(); // starts listening; nothing more is read while the burst comes
    await settle(10);
    const burst = SUBSCRIBER_BACKLOG_MAX + 100;
    for (let n = 0; n < burst; n++) pubsub.publish("eventAppended", "tenant-a", { id: `e${n}`, scope: "PROJECT", scopeRef: "burst" });
    expect((await first).value).toMatchObject({ id: "e0" });
    let delivered = 1;
    const ending = await (async () => {
      for (;;) {
        try {
          const { done } = await events.next();
          if (done) return "done";
          delivered += 1;
        } catch (error) {
          return error;
        }
      }
    })();
    expect(ending).toBeInstanceOf(EngramError);
    expect((ending as EngramError).code).toBe("SUBSCRIBER_TOO_SLOW");
    expect(delivered).toBeGreaterThanOrEqual(SUBSCRIBER_BACKLOG_MAX);
    expect(delivered).toBeLessThan(burst);

    // Another subscriber of the topic is not ended with it.
    const other = pubsub.subscribe("eventAppended", "tenant-a")[Symbol.asyncIterator]();
    const next = other.next();
    await settle(10);
    pubsub.publish("eventAppended", "tenant-a", { id: "after", scope: "PROJECT", scopeRef: "burst" });
    expect((await next).value).toMatchObject({ id: "after" });
    await other.return?.();
  });

  describe("over a WebSocket", () => {
    let engram: TestEngram;
    let url: string;

    beforeAll(async () => {
      engram = await startTestEngram();
      url = await engram.listen();
    }, 120_000);

    afterAll(async () => {
      await engram?.stop();
    });

    it("gets SUBSCRIBER_TOO_SLOW while the server carries on", async () => {
      const { data } = await engram.gql(APPEND, {}, engram.tenant.writer);
      const ref = { id: data.appendEvent.id, scope: "PROJECT", scopeRef: "burst" };
      const client = wsClient(url, engram.tenant.reader);
      const feed = collect(client, FEED);
      await settle();
      // More announcements in one go than the subscriber can re-read and send meanwhile.
      for (let n = 0; n <= SUBSCRIBER_BACKLOG_MAX + 100; n++) engram.services.pubsub.publish("eventAppended", engram.tenant.tenantId, ref);
      const deadline = Date.now() + 60_000;
      while (!feed.failure && Date.now() < deadline) await settle(100);
      expect(feed.failure).toEqual([expect.objectContaining({ extensions: { code: "SUBSCRIBER_TOO_SLOW" } })]);

      // The server is up, and a new subscription hears the next append.
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      const again = collect(client, FEED);
      await settle();
      await engram.gql(APPEND.replace('"Burst."', '"After."'), {}, engram.tenant.writer);
      expect((await again.next()).data?.eventAppended.body).toBe("After.");
      again.dispose();
      await client.dispose();
    }, 90_000);
  });
});
