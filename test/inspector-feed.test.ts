import { spawn } from "node:child_process";
import net from "node:net";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DESKTOP, ensureInspectorBuilt, launchChromium, poll, ROOT, signIn } from "./helpers/browser.ts";
import { SUBSCRIBER_BACKLOG_MAX } from "../src/pubsub.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { say } from "./helpers/recall.ts";

// The feed's history (issue 16, bugs 1, 2 and 4): what was announced before the page opened is
// there, filters are in the URL and survive a reload, older items page in, and a CLI run (another
// process with its own pubsub) reaches the feed through the activity log.

let engram: TestEngram;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let url: string;

beforeAll(async () => {
  await ensureInspectorBuilt();
  engram = await startTestEngram();
  url = await engram.listen();
  browser = await launchChromium();
  context = await browser.newContext({ viewport: DESKTOP });
  page = await context.newPage();
}, 180_000);

afterAll(async () => {
  await browser?.close();
  await engram?.stop();
});

/** Runs the CLI to its end against the test's store. */
function cli(args: string[]) {
  return new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
    const env: Record<string, string> = { ENGRAM_LOG_LEVEL: "warn", ...engram.store.vars };
    for (const name of ["PATH", "HOME", "TMPDIR"]) if (process.env[name]) env[name] = process.env[name]!;
    const child = spawn(process.execPath, ["bin/engram.mjs", ...args], { cwd: ROOT, env, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stderr }));
  });
}

/**
 * A TCP link between the browser and Engram that can go down like a network does: every open
 * connection cut and new ones refused, while Engram itself stays up and keeps writing.
 */
async function startLink(target: string) {
  const { hostname, port } = new URL(target);
  const open = new Set<net.Socket>();
  let down = false;
  const server = net.createServer((client) => {
    if (down) return client.destroy();
    const upstream = net.connect(Number(port), hostname);
    const close = () => {
      for (const socket of [client, upstream]) open.delete(socket), socket.destroy();
    };
    for (const socket of [client, upstream]) open.add(socket), socket.on("error", close).on("close", close);
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    cut() {
      down = true;
      for (const socket of open) socket.destroy();
    },
    restore() {
      down = false;
    },
    stop: () => new Promise<void>((resolve) => (server.close(() => resolve()), [...open].forEach((s) => s.destroy()))),
  };
}

const FORGET = `mutation($id: ID!) { forgetUser(endUserId: $id) { facts messages activity } }`;
const HISTORY = `query($user: ID, $after: String, $kinds: [FeedKind!]) {
  memoryFeed(endUserId: $user, first: 3, after: $after, kinds: $kinds) { items { __typename id } endCursor hasMore } }`;

describe("the feed's history", () => {
  let ada = { endUserId: "", conversationId: "" };
  let bea = { endUserId: "", conversationId: "" };

  it("shows what happened before the page opened, and keeps it across a reload, a filter change and a view change", async () => {
    ada = await say(engram, { user: "ada", conversation: "trip", agent: "concierge" }, "A quiet room, please.", "Noted.", engram.tenant.writer);
    await say(engram, { user: "ada", conversation: "trip", agent: "concierge" }, "Near the harbour.", "Sure.", engram.tenant.writer);
    bea = await say(engram, { user: "bea", conversation: "flat", agent: "concierge" }, "Two bedrooms.", "Fine.", engram.tenant.writer);
    await signIn(page, url, engram.tenant.writer);

    await poll(() => page.locator('[data-kind="turn"]').count()).toBe(3);
    expect(await page.locator(".feed-item").first().textContent()).toContain("Two bedrooms.");

    await page.getByLabel("User").selectOption({ label: "bea" });
    await poll(() => page.locator('[data-kind="turn"]').count()).toBe(1);
    expect(new URL(page.url()).searchParams.get("user")).toBe(bea.endUserId);
    await page.reload();
    await poll(() => page.locator('[data-kind="turn"]').count()).toBe(1);
    expect(await page.getByLabel("User").inputValue()).toBe(bea.endUserId);

    // The live view appends to the history it loaded.
    await say(engram, { user: "bea", conversation: "flat", agent: "concierge" }, "With a balcony.", "Got it.", engram.tenant.writer);
    await poll(() => page.locator('[data-kind="turn"]').count()).toBe(2);
    expect(await page.locator(".feed-item").first().textContent()).toContain("With a balcony.");

    // Kinds are a filter too, in the URL as well.
    await page.getByLabel("Facts").check();
    await poll(() => page.locator('[data-kind="turn"]').count()).toBe(0);
    expect(new URL(page.url()).searchParams.get("kinds")).toBe("FACT");
    await engram.gql(`mutation($id: ID!) { addFact(input: { endUserId: $id, text: "Wants a balcony." }) { id } }`, { id: bea.endUserId }, engram.tenant.writer);
    await page.locator('[data-kind="fact"]', { hasText: "added" }).waitFor();
    await page.getByLabel("Facts").uncheck();

    // Another view and back: the history is read again, nothing is lost.
    await page.getByRole("link", { name: "Costs & jobs" }).click();
    await page.getByRole("link", { name: "Live feed" }).click();
    await poll(() => page.locator('[data-kind="turn"]').count()).toBe(4);
  });

  it("pages through older items", async () => {
    for (let n = 1; n <= 55; n++) {
      const { errors } = await engram.gql(
        `mutation($body: String!) { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "note", body: $body, source: "crm" }) { id } }`,
        { body: `Note ${n}` },
        engram.tenant.writer,
      );
      expect(errors).toBeUndefined();
    }
    await page.goto(`${url}/inspector/?kinds=EVENT`);
    await poll(() => page.locator('[data-kind="event"]').count()).toBe(50);
    expect(await page.locator(".feed-item").first().textContent()).toContain("Note 55");
    await page.getByRole("button", { name: "Load older" }).click();
    await poll(() => page.locator('[data-kind="event"]').count()).toBe(55);
    expect(await page.locator(".feed-item").last().textContent()).toContain("Note 1");
    expect(await page.getByRole("button", { name: "Load older" }).count()).toBe(0);

    // The same through the API, a page at a time.
    const first = await engram.gql(HISTORY, { kinds: ["TURN"] }, engram.tenant.reader);
    expect(first.data.memoryFeed.items).toHaveLength(3);
    expect(first.data.memoryFeed.hasMore).toBe(true);
    const second = await engram.gql(HISTORY, { kinds: ["TURN"], after: first.data.memoryFeed.endCursor }, engram.tenant.reader);
    expect(second.data.memoryFeed.items).toHaveLength(1);
    expect(second.data.memoryFeed.hasMore).toBe(false);
  });

  it("draws at most 200 items however many arrive live, and shows the rest when asked", async () => {
    await page.goto(`${url}/inspector/?kinds=EVENT`);
    await poll(() => page.getByTestId("live-status").textContent()).toBe("Live");
    await poll(() => page.locator('[data-kind="event"]').count()).toBe(50);
    for (let n = 1; n <= 230; n++) {
      const { errors } = await engram.gql(
        `mutation($body: String!) { appendEvent(input: { scope: ENTITY, scopeRef: "busy", kind: "note", body: $body, source: "crm" }) { id } }`,
        { body: `Busy ${n}` },
        engram.tenant.writer,
      );
      expect(errors).toBeUndefined();
    }
    await page.locator(".feed-item", { hasText: "Busy 230" }).waitFor();
    // Every item stayed drawn before, so a feed left open on a busy tenant grew without bound.
    expect(await page.locator(".feed-item").count()).toBe(200);
    expect(await page.locator(".feed-item").first().textContent()).toContain("Busy 230");
    await page.getByRole("button", { name: "Show older (80 more)" }).click();
    await poll(() => page.locator(".feed-item").count()).toBe(280);
    expect(await page.locator(".feed-item").last().textContent()).toContain("Note 6");
    await page.getByRole("button", { name: "Load older" }).click();
    await poll(() => page.locator(".feed-item").count()).toBe(285);
  }, 120_000);

  it("shows a compaction run started from the CLI", async () => {
    const run = await cli(["compact", "--now"]);
    expect(run.code, run.stderr).toBe(0);
    await page.goto(`${url}/inspector/?kinds=JOB_RUN`);
    await page.locator('[data-kind="job"]', { hasText: "memory.compact" }).first().waitFor();
    expect(await page.locator('[data-kind="job"]', { hasText: "memory.compact" }).first().textContent()).toMatch(/skipped|succeeded|failed/);
  }, 120_000);

  it("keeps no content, and forgetting a user removes their rows", async () => {
    const rows = await engram.services.db.activityLog.findMany({ where: { tenantId: engram.tenant.tenantId } });
    expect(JSON.stringify(rows)).not.toMatch(/balcony|bedrooms|quiet room/i);

    const { data, errors } = await engram.gql(FORGET, { id: bea.endUserId }, engram.tenant.writer);
    expect(errors).toBeUndefined();
    // Two turns and a fact.
    expect(data.forgetUser.activity).toBe(3);
    const left = await engram.services.db.activityLog.findMany({
      where: { tenantId: engram.tenant.tenantId, OR: [{ endUserId: bea.endUserId }, { conversationId: bea.conversationId }] },
    });
    // Only the record that a forget happened: no fact, no conversation.
    expect(left.map((r) => [r.kind, r.change, r.refId, r.conversationId])).toEqual([["FACT", "FORGOTTEN", null, null]]);
    const history = await engram.gql(HISTORY, { user: bea.endUserId }, engram.tenant.reader);
    expect(history.data.memoryFeed.items.map((i: { __typename: string }) => i.__typename)).toEqual(["FactFeedItem"]);
    // The user's page keeps a record of the forget: who, when, what kinds and how many.
    await page.goto(`${url}/inspector/users/${bea.endUserId}`);
    const record = page.getByTestId("forget-records").locator("li").first();
    await record.waitFor();
    expect(await record.textContent()).toMatch(/everything · asked by key .*1 facts.*3 feed history rows/);
    expect(await record.textContent()).not.toMatch(/balcony|bedrooms/i);
    // Ada's history is untouched.
    expect((await engram.gql(HISTORY, { user: ada.endUserId }, engram.tenant.reader)).data.memoryFeed.items).toHaveLength(2);
  });

  it("after a lost connection, shows what happened while it was away, on the feed and on a conversation", async () => {
    const link = await startLink(url);
    try {
      const who = { user: "cy", conversation: "gap", agent: "concierge" };
      const { conversationId } = await say(engram, who, "Before the drop.", "Noted.", engram.tenant.writer);
      await signIn(page, link.url, engram.tenant.reader);
      const status = () => page.getByTestId("live-status").textContent();
      await page.locator(".feed-item", { hasText: "Before the drop." }).waitFor();
      await poll(status).toBe("Live");

      link.cut();
      await poll(status).toBe("Reconnecting…");
      await say(engram, who, "During the drop.", "Noted.", engram.tenant.writer);
      link.restore();
      await poll(status).toBe("Live");
      // No reload: the page reads again what it missed (it stayed missing until a reload before).
      await page.locator(".feed-item", { hasText: "During the drop." }).waitFor({ timeout: 20_000 });
      await say(engram, who, "After the drop.", "Noted.", engram.tenant.writer);
      await page.locator(".feed-item", { hasText: "After the drop." }).waitFor();
      const order = await page.locator('[data-kind="turn"]').allTextContents();
      const at = (text: string) => order.findIndex((t) => t.includes(text));
      expect([at("After the drop."), at("During the drop."), at("Before the drop.")]).toEqual([0, 1, 2]);

      // A conversation's page: its messages too.
      await page.goto(`${link.url}/inspector/conversations/${conversationId}`);
      await page.getByRole("cell", { name: "After the drop." }).waitFor();
      await poll(status).toBe("Live");
      link.cut();
      await poll(status).toBe("Reconnecting…");
      await say(engram, who, "Said while the page was away.", "Noted.", engram.tenant.writer);
      link.restore();
      await page.getByRole("cell", { name: "Said while the page was away." }).waitFor({ timeout: 20_000 });
    } finally {
      await link.stop();
    }
  });

  it("keeps listening after a burst its subscription fell behind on", async () => {
    const append = (body: string) =>
      engram.gql(`mutation($body: String!) { appendEvent(input: { scope: ENTITY, scopeRef: "burst", kind: "note", body: $body, source: "crm" }) { id } }`, { body }, engram.tenant.writer);
    const { data } = await append("The burst's event.");
    await signIn(page, url, engram.tenant.reader);
    await page.goto(`${url}/inspector/?kinds=EVENT`);
    await poll(() => page.getByTestId("live-status").textContent()).toBe("Live");
    // More announcements at once than the server lets wait for one subscriber: it ends the page's.
    const ref = { id: data.appendEvent.id, scope: "ENTITY", scopeRef: "burst" };
    for (let n = 0; n <= SUBSCRIBER_BACKLOG_MAX + 50; n++) engram.services.pubsub.publish("eventAppended", engram.tenant.tenantId, ref);
    await append("After the burst.");
    // The page subscribed again and read what went by (it showed the error and heard nothing more before).
    await page.locator(".feed-item", { hasText: "After the burst." }).waitFor({ timeout: 30_000 });
    expect(await page.getByRole("alert").count()).toBe(0);
    await append("Live again.");
    await page.locator(".feed-item", { hasText: "Live again." }).waitFor();
  }, 90_000);

  it("says 'Not listening', not 'Reconnecting…', on a view without a subscription while the server is up", async () => {
    await page.goto(`${url}/inspector/`);
    await poll(() => page.getByTestId("live-status").textContent()).toBe("Live");
    await page.getByRole("link", { name: "Entries & events" }).click();
    await poll(() => page.getByTestId("live-status").textContent()).toBe("Not listening");
    await page.getByRole("link", { name: "Live feed" }).click();
    await poll(() => page.getByTestId("live-status").textContent()).toBe("Live");
  });
});
