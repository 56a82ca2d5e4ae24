import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngramClient, EngramError } from "engram/client";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import WebSocket from "ws";
import { DEFAULT_TIMEOUT_MS } from "../src/client/transport.ts";
import { readEnv } from "../src/env.ts";
import { startFlakyProxy } from "./helpers/flaky-proxy.ts";
import { allIndexed, INDEXING_TIMEOUT_MS } from "./helpers/recall.ts";
import { collect, settle, wsClient } from "./helpers/ws.ts";

// The typed client against a real Engram on port 0, over real HTTP and WebSocket.
let engram: TestEngram;
let url: string;
let proxy: Awaited<ReturnType<typeof startFlakyProxy>>;
const client = (apiKey: string, options: Partial<ConstructorParameters<typeof EngramClient>[0]> = {}) =>
  new EngramClient({ url, apiKey, backoffMs: 10, ...options });

beforeAll(async () => {
  engram = await startTestEngram({ worker: true });
  url = await engram.listen();
  proxy = await startFlakyProxy(url);
});
afterAll(async () => {
  await proxy?.stop();
  await engram?.stop();
});

/** A shop turn of one user, in their conversation "<user>-1". */
const shopTurn = (engramClient: EngramClient, user: string, userMessage: string, assistantMessage: string) =>
  engramClient.recordTurn({ agentExternalId: "shop", endUserExternalId: user, conversationExternalId: `${user}-1`, userMessage, assistantMessage });

const expectCode = async (promise: Promise<unknown>, code: string) => {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(EngramError);
  expect((error as EngramError).code).toBe(code);
  return error as EngramError;
};

describe("the event log and curated entries", () => {
  it("appends events, generating a sourceRef when none is given", async () => {
    const engramClient = client(engram.tenant.writer);
    const event = await engramClient.appendEvent({ scope: "PROJECT", scopeRef: "launch", kind: "decision", body: "ROAS target is 3.", source: "crm" });
    expect(event.sourceRef).toMatch(/^[0-9a-f-]{36}$/);
    const again = await engramClient.appendEvent({ scope: "PROJECT", scopeRef: "launch", kind: "decision", body: "x", source: "crm", sourceRef: event.sourceRef });
    expect(again.id).toBe(event.id);
    const { events } = await client(engram.tenant.reader).events({ scope: "PROJECT", scopeRef: "launch" });
    expect(events.map((e) => e.id)).toEqual([event.id]);
  });

  it("creates, searches, corrects and forgets entries", async () => {
    const writer = client(engram.tenant.writer);
    const entry = await writer.createEntry({ scope: "ENTITY", scopeRef: "acme", title: "ROAS review", summary: "Acme wants ROAS above 3.", tags: ["ads"] });
    await writer.createEntry({ scope: "ENTITY", scopeRef: "acme", title: "Billing", summary: "Invoices go to finance.", tags: ["billing"] });
    const found = await writer.searchEntries({ scope: "ENTITY", scopeRef: "acme", search: "ROAS" });
    expect(found.entries.map((e) => e.title)).toEqual(["ROAS review"]);
    expect((await writer.searchEntries({ tags: ["billing"] })).entries.map((e) => e.title)).toEqual(["Billing"]);
    const corrected = await writer.correctEntry(entry.id, { importance: 5 });
    expect(corrected.importance).toBe(5);
    expect(await writer.forgetEntry(entry.id)).toMatchObject({ entryId: entry.id, change: "FORGOTTEN" });
    await expectCode(writer.forgetEntry(entry.id), "NOT_FOUND");
  });
});

describe("conversations, facts and recall", () => {
  it("records turns, reads context and works with the user's facts", async () => {
    const writer = client(engram.tenant.writer);
    const turn = await shopTurn(writer, "ana", "I ordered the blue trail running shoes in size 42.", "Noted: blue trail runners, size 42.");
    expect(turn.clientTurnId).toMatch(/^[0-9a-f-]{36}$/);
    const endUserId = turn.conversation.endUser.id;

    const context = await writer.context({ conversationId: turn.conversation.id, message: "When do they arrive?" });
    const tail = context.blocks.find((block) => block.kind === "TAIL");
    expect(tail?.text).toContain("size 42");

    const fact = await writer.addFact({ endUserId, text: "Ana runs trail races." });
    expect((await writer.correctFact(fact.id, { text: "Ana runs trail marathons.", core: true })).core).toBe(true);
    expect((await client(engram.tenant.reader).facts(endUserId)).map((f) => f.text)).toEqual(["Ana runs trail marathons."]);
    expect(await writer.deleteFact(fact.id)).toMatchObject({ factId: fact.id });
    await writer.addFact({ endUserId, text: "Ana lives in Porto." });
    expect((await writer.forgetUser(endUserId)).facts).toBe(1);
    expect(await writer.facts(endUserId)).toEqual([]);
  });

  it("names the end user by your own id where it names them by Engram's: facts, index status, forgetUser", async () => {
    const writer = client(engram.tenant.writer);
    const turn = await shopTurn(writer, "dee", "My dog is called Miso.", "Miso, noted.");
    await writer.addFact({ endUserExternalId: "dee", text: "Dee has a dog called Miso." });
    // Trimmed as recordTurn takes it.
    expect((await writer.facts({ externalId: " dee " })).map((f) => f.text)).toEqual(["Dee has a dog called Miso."]);
    expect(await writer.recallIndexStatus({ externalId: "dee" })).toHaveProperty("pending");
    expect((await writer.conversation(" dee-1"))?.id).toBe(turn.conversation.id);
    expect((await writer.endUser("dee "))?.id).toBe(turn.conversation.endUser.id);

    await expectCode(writer.facts({ externalId: "nobody" }), "NOT_FOUND");
    await expectCode(writer.forgetUser({ externalId: "nobody" }), "NOT_FOUND");
    // Another tenant's user of the same id is not this tenant's.
    await expectCode(client(engram.other.writer).forgetUser({ externalId: "dee" }), "NOT_FOUND");
    for (const args of [`endUserId: "x", endUserExternalId: "dee"`, ""]) {
      const answer = await engram.gql(`{ facts${args ? `(${args})` : ""} { id } }`, {}, engram.tenant.writer);
      expect(answer.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    }

    const receipt = await writer.forgetUser({ externalId: "dee" });
    expect(receipt).toMatchObject({ facts: 1, messages: 2 });
    expect(await writer.facts({ externalId: "dee" })).toEqual([]);
  });

  // 68c0254 gave these fields endUserExternalId too, and its tests ran facts, recallIndexStatus
  // and forgetUser by it only: here the subscription, the forget records and the export.
  it("takes your own id on the factChanged subscription, forgetRecords and exportUser too, for this tenant's user only", async () => {
    const writer = client(engram.tenant.writer);
    const turn = await shopTurn(writer, "eli", "I collect stamps.", "Stamps, noted.");
    const eli = turn.conversation.endUser.id;
    const ws = wsClient(url, engram.tenant.reader);
    const live = collect(ws, `subscription { factChanged(endUserExternalId: " eli ") { change text } }`);
    const stranger = collect(ws, `subscription { factChanged(endUserExternalId: "nobody") { change } }`);
    await settle();
    await writer.addFact({ endUserExternalId: "eli", text: "Eli collects stamps." });
    await live.next(1);
    expect(live.received.map((r) => r.data?.factChanged)).toEqual([{ change: "ADDED", text: "Eli collects stamps." }]);
    await stranger.next(1).catch(() => undefined);
    expect(stranger.received[0]?.errors?.[0]?.extensions?.code ?? (stranger.failure as any)?.[0]?.extensions?.code).toBe("NOT_FOUND");

    const exported = await engram.gql(`{ exportUser(endUserExternalId: "eli") }`, {}, engram.tenant.admin);
    expect(exported.errors).toBeUndefined();
    expect(exported.data.exportUser.endUser).toMatchObject({ id: eli, externalId: "eli" });
    const elsewhere = await engram.gql(`{ exportUser(endUserExternalId: "eli") }`, {}, engram.other.admin);
    expect(elsewhere.errors?.[0].extensions?.code).toBe("NOT_FOUND");

    await writer.forgetUser({ externalId: "eli" });
    const records = await engram.gql(`{ forgetRecords(endUserExternalId: "eli") { kind receipt { facts } } }`, {}, engram.tenant.reader);
    expect(records.data.forgetRecords).toEqual([{ kind: "USER", receipt: { facts: 1 } }]);
    live.dispose();
    stranger.dispose();
    await ws.dispose();
  });

  it("recalls the user's earlier conversations", async () => {
    const writer = client(engram.tenant.writer);
    const turn = await shopTurn(writer, "bo", "Please send the invoice for the kayak paddles to my office.", "Done: the kayak paddle invoice goes to your office.");
    await allIndexed(engram, undefined, INDEXING_TIMEOUT_MS);
    const recall = await writer.recall({ endUserId: turn.conversation.endUser.id, text: "Where did my kayak invoice go?" });
    expect(recall.candidates[0]).toMatchObject({ conversationId: turn.conversation.id, kind: "TURN" });
    expect(recall.candidates[0].text).toContain("kayak");
  }, INDEXING_TIMEOUT_MS + 60_000);
});

describe("typed errors", () => {
  it("carries the server's extensions.code", async () => {
    await expectCode(client(engram.tenant.reader).appendEvent({ scope: "TEAM", scopeRef: "t", kind: "k", body: "b", source: "s" }), "FORBIDDEN");
    await expectCode(client("egm_not-a-key").facts("x"), "UNAUTHENTICATED");
    const bad = await expectCode(client(engram.tenant.writer).createEntry({ scope: "TEAM", scopeRef: "t", title: "", summary: "s" }), "BAD_USER_INPUT");
    expect(bad.message).toMatch(/title/);
  });

  it("finds nothing of another tenant: its ids are NOT_FOUND", async () => {
    const theirs = await client(engram.other.writer).createEntry({ scope: "TEAM", scopeRef: "t", title: "Theirs", summary: "s" });
    await expectCode(client(engram.tenant.admin).correctEntry(theirs.id, { title: "Mine now" }), "NOT_FOUND");
    await expectCode(client(engram.tenant.admin).forgetEntry(theirs.id), "NOT_FOUND");
  });
});

describe("retries, timeouts and aborts (through a faulty proxy)", () => {
  const viaProxy = (options: Partial<ConstructorParameters<typeof EngramClient>[0]> = {}) =>
    new EngramClient({ url: proxy.url, apiKey: engram.tenant.writer, backoffMs: 10, ...options });

  it("retries a turn whose answer was lost: the same turn, recorded once", async () => {
    proxy.fail("drop-answer", "503");
    const turn = await shopTurn(viaProxy(), "cy", "Hello there", "Hi!");
    expect(proxy.seen.slice(-3).map((r) => r.fault)).toEqual(["drop-answer", "503", undefined]);
    const turns = await engram.services.db.turn.findMany({ where: { conversationId: turn.conversation.id } });
    expect(turns.map((t) => t.id)).toEqual([turn.id]);
  });

  it("retries an append whose answer was lost: one event", async () => {
    proxy.fail("drop-answer");
    const event = await viaProxy().appendEvent({ scope: "TEAM", scopeRef: "retry", kind: "note", body: "once", source: "webhook" });
    expect(await engram.services.db.memoryEvent.count({ where: { scopeRef: "retry" } })).toBe(1);
    expect(event.scopeRef).toBe("retry");
  });

  it("does not retry a write that is not idempotent, and gives up after the retries", async () => {
    proxy.fail("503");
    const once = await expectCode(viaProxy().createEntry({ scope: "TEAM", scopeRef: "t", title: "x", summary: "y" }), "HTTP_ERROR");
    expect(once.details).toMatchObject({ status: 503, attempts: 1 });
    proxy.fail("503", "503", "503");
    const exhausted = await expectCode(viaProxy({ retries: 2 }).facts("x"), "HTTP_ERROR");
    expect(exhausted.details.attempts).toBe(3);
  });

  it("times out a call that gets no answer, and stops at once when aborted", async () => {
    proxy.fail("hang");
    await expectCode(viaProxy({ retries: 0 }).facts("x", { timeoutMs: 300 }), "TIMEOUT");
    proxy.fail("hang");
    const controller = new AbortController();
    const call = viaProxy().facts("x", { signal: controller.signal, timeoutMs: 60_000 });
    setTimeout(() => controller.abort(), 50);
    await expectCode(call, "ABORTED");
  });

  it("times out, or stops when aborted, while the answer's body is still arriving", async () => {
    proxy.fail("stall-body");
    await expectCode(viaProxy({ retries: 0 }).facts("x", { timeoutMs: 300 }), "TIMEOUT");
    proxy.fail("stall-body");
    const controller = new AbortController();
    const call = viaProxy().facts("x", { signal: controller.signal, timeoutMs: 60_000 });
    setTimeout(() => controller.abort(), 100);
    await expectCode(call, "ABORTED");
  });

  it("waits longer by default than the server gives a request's model calls, so a stalled model is a degraded answer", () => {
    expect(DEFAULT_TIMEOUT_MS).toBeGreaterThanOrEqual(2 * readEnv({}).ENGRAM_REPLY_MODEL_TIMEOUT_MS);
  });

  it("reports an unreachable server as NETWORK_ERROR", async () => {
    const error = await expectCode(
      new EngramClient({ url: "http://127.0.0.1:1", apiKey: "k", retries: 1, backoffMs: 1 }).facts("x"),
      "NETWORK_ERROR",
    );
    expect(error.details.attempts).toBe(2);
  });
});

/** The first event of an eventAppended subscription on TEAM/scopeRef: it is set up asynchronously, so events are appended until one arrives. */
async function firstEvent<T>(stream: AsyncIterator<T>, scopeRef: string) {
  const first = stream.next();
  const writer = client(engram.tenant.writer);
  let arrived = false;
  void first.then(() => (arrived = true));
  for (let i = 0; i < 50 && !arrived; i++) {
    await writer.appendEvent({ scope: "TEAM", scopeRef, kind: "note", body: `event ${i}`, source: "test", sourceRef: `${scopeRef}-${i}` });
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return first;
}

describe("subscribe", () => {
  it("iterates a topic over graphql-ws, and ends when the loop breaks", async () => {
    const reader = client(engram.tenant.reader);
    const stream = reader.subscribe("eventAppended", { scope: "TEAM", scopeRef: "live" });
    const { value } = await firstEvent(stream, "live");
    expect(value).toMatchObject({ scope: "TEAM", scopeRef: "live", kind: "note" });
    await stream.return(undefined);
    await reader.close();
  });

  it("throws a typed error when the key is refused, at once: a refused key is not tried again", async () => {
    let sockets = 0;
    const counted = class extends WebSocket {
      constructor(...args: ConstructorParameters<typeof WebSocket>) {
        super(...args);
        sockets++;
      }
    };
    const stranger = client("egm_not-a-key", { retries: 3, webSocketImpl: counted });
    const stream = stranger.subscribe("factChanged", { endUserId: "x" });
    await expectCode(stream.next(), "UNAUTHENTICATED");
    expect(sockets).toBe(1);
    await stranger.close();
  });

  it("ends a subscription whose key is revoked with UNAUTHENTICATED, not a network error", async () => {
    const created = await engram.gql(`mutation { createApiKey(name: "short-lived", role: READER) { id key } }`, {}, engram.tenant.admin);
    const reader = client(created.data.createApiKey.key);
    const stream = reader.subscribe("eventAppended", { scope: "TEAM", scopeRef: "revoked" });
    // Revoked once the subscription delivers.
    await firstEvent(stream, "revoked");
    await engram.gql(`mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, { id: created.data.createApiKey.id }, engram.tenant.admin);
    const error = await expectCode(stream.next(), "UNAUTHENTICATED");
    expect(error.retryable).toBe(false);
    await reader.close();
  });
});
