import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { axeViolations, DESKTOP, ensureInspectorBuilt, horizontalOverflow, launchChromium, PHONE, poll, signIn } from "./helpers/browser.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

// Issue 16 in Chromium: a conversation opens without calling a model, older messages and
// private-step gaps, safe fact edits, one sign-in per origin, a revoked key, and phones.

let engram: TestEngram;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let url: string;

const RECORD = `mutation($input: RecordTurnInput!) { recordTurn(input: $input) { id conversation { id endUser { id } } } }`;
const LONG_URL = `https://example.com/${"very-long-path-segment-".repeat(20)}end`;
let turnNo = 0;

async function record(user: string, conversation: string, userMessage: string, privateSteps?: string[]) {
  const { data, errors } = await engram.gql(
    RECORD,
    {
      input: {
        agentExternalId: "concierge",
        endUserExternalId: user,
        conversationExternalId: conversation,
        clientTurnId: `v2-${++turnNo}`,
        userMessage,
        assistantMessage: `Reply ${turnNo}.`,
        privateSteps,
      },
    },
    engram.tenant.writer,
  );
  expect(errors).toBeUndefined();
  return { conversationId: data.recordTurn.conversation.id as string, endUserId: data.recordTurn.conversation.endUser.id as string };
}

let trip = { conversationId: "", endUserId: "" };

beforeAll(async () => {
  await ensureInspectorBuilt();
  engram = await startTestEngram();
  url = await engram.listen();
  trip = await record("ada", "trip", "My first message, with a private step after it.", ["lookup: hotels near the harbour"]);
  for (let n = 2; n <= 22; n++) await record("ada", "trip", n === 22 ? `See ${LONG_URL}` : `Message ${n}.`);
  browser = await launchChromium();
  context = await browser.newContext({ viewport: DESKTOP });
  page = await context.newPage();
  await signIn(page, url, engram.tenant.writer);
}, 180_000);

afterAll(async () => {
  await browser?.close();
  await engram?.stop();
});

describe("the inspector, issue 16", () => {
  it("opens a conversation without assembling a context; Assemble does; older messages load, and gaps say what they are", async () => {
    const contextCalls: string[] = [];
    page.on("request", (request) => {
      if (request.url().endsWith("/graphql") && request.postData()?.includes("context(input")) contextCalls.push(request.postData()!);
    });
    await page.goto(`${url}/inspector/conversations/${trip.conversationId}`);
    // The conversation's own heading: the Live column's turns name the conversation too.
    await page.locator("#conversation-title").filter({ hasText: "trip" }).waitFor();
    await page.locator("table.messages tbody tr").first().waitFor();
    expect(contextCalls).toEqual([]);
    expect(await page.getByTestId("block-TAIL").count()).toBe(0);
    await page.getByRole("button", { name: "Assemble" }).click();
    await page.getByTestId("block-TAIL").waitFor();
    expect(contextCalls).toHaveLength(1);

    // 44 public messages (and one private step): the newest 40 first, then the rest.
    expect(await page.locator("table.messages tbody tr:not(.gap)").count()).toBe(40);
    await page.getByRole("button", { name: "Load older messages" }).click();
    // A failed load shows its error (role alert): the poll then says what it was.
    const rowsOrAlert = async () => (await page.getByRole("alert").allTextContents()).join(" ") || page.locator("table.messages tbody tr:not(.gap)").count();
    await poll(rowsOrAlert).toBe(44);
    expect(await page.getByRole("button", { name: "Load older messages" }).count()).toBe(0);
    expect(await page.getByTestId("message-gap").textContent()).toMatch(/#2.*1 message not shown: private steps/);
  });

  it("edits facts safely: a textarea, Escape cancels, unchanged saves nothing, delete asks and can be undone, errors clear", async () => {
    const { data } = await engram.gql(
      `mutation($id: ID!) { addFact(input: { endUserId: $id, text: "Prefers quiet rooms.", core: true }) { id } }`,
      { id: trip.endUserId },
      engram.tenant.writer,
    );
    const factId = data.addFact.id;
    const versions = async () => (await engram.gql(`query($id: ID!) { factHistory(factId: $id) { id } }`, { id: factId })).data.factHistory.length;
    await page.goto(`${url}/inspector/users/${trip.endUserId}`);
    const fact = page.getByTestId("fact").filter({ hasText: "Prefers quiet rooms." });
    await fact.waitFor();

    await fact.getByRole("button", { name: "Edit" }).click();
    expect(await page.getByLabel("Fact text").evaluate((el) => el.tagName)).toBe("TEXTAREA");
    await page.getByLabel("Fact text").fill("Something else entirely.");
    await page.getByLabel("Fact text").press("Escape");
    await fact.getByRole("button", { name: "Edit" }).waitFor();
    expect(await fact.textContent()).toContain("Prefers quiet rooms.");

    await fact.getByRole("button", { name: "Edit" }).click();
    await page.getByRole("button", { name: "Save" }).click();
    await fact.getByRole("button", { name: "Edit" }).waitFor();
    expect(await versions()).toBe(1);

    // In the FACTS block the core flag reads as "core", not as a score.
    await page.goto(`${url}/inspector/conversations/${trip.conversationId}`);
    await page.getByRole("button", { name: "Assemble" }).click();
    await page.getByTestId("block-FACTS").waitFor();
    expect(await page.getByTestId("block-FACTS").textContent()).toContain("core");
    expect(await page.getByTestId("block-FACTS").textContent()).not.toMatch(/score \d/);

    await page.goto(`${url}/inspector/users/${trip.endUserId}`);
    await fact.getByRole("button", { name: "Delete" }).click();
    await page.getByRole("button", { name: "Keep it" }).click();
    expect(await fact.count()).toBe(1);
    await fact.getByRole("button", { name: "Delete" }).click();
    await page.getByRole("button", { name: "Delete fact" }).click();
    await page.getByText("Nothing is known about this user.").waitFor();
    await page.getByRole("button", { name: "Undo" }).click();
    await page.getByTestId("fact").filter({ hasText: "Prefers quiet rooms." }).waitFor();
    expect(await page.getByTestId("fact").filter({ hasText: "core" }).count()).toBe(1);

    // A refused add shows its error; clearing the field clears it.
    await page.getByLabel("New fact").fill("x".repeat(600));
    await page.getByRole("button", { name: "Add fact" }).click();
    await page.getByRole("alert").waitFor();
    await page.getByLabel("New fact").fill("");
    await poll(() => page.getByRole("alert").count()).toBe(0);
  });

  it("shares the sign-in between the origin's tabs, and signing out in one signs out the others", async () => {
    const second = await context.newPage();
    try {
      await second.goto(`${url}/inspector/users`);
      await second.getByRole("navigation", { name: "Sections" }).waitFor();
      expect(await second.getByTestId("role").textContent()).toBe("writer");
      await second.getByRole("button", { name: "Sign out" }).click();
      await page.getByLabel("API key").waitFor();
      expect(await page.getByRole("alert").textContent()).toContain("You signed out in another tab.");
    } finally {
      await second.close();
    }
    await signIn(page, url, engram.tenant.writer);
  });

  it("returns to sign-in with one clear message when the key is revoked", async () => {
    const created = await engram.gql(`mutation { createApiKey(name: "temp", role: READER) { id key } }`, {}, engram.tenant.admin);
    await signIn(page, url, created.data.createApiKey.key);
    await engram.gql(`mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, { id: created.data.createApiKey.id }, engram.tenant.admin);
    // The next call refused (the page's own, or this click's) sends the page back to sign-in.
    const users = page.getByRole("link", { name: "Users" });
    if (await users.isVisible()) await users.click({ timeout: 2_000 }).catch(() => {});
    await page.getByLabel("API key").waitFor();
    expect(await page.getByRole("alert").count()).toBe(1);
    expect(await page.getByRole("alert").textContent()).toContain("Your key no longer works");
    expect(await page.getByRole("button", { name: "Try again" }).count()).toBe(0);
    expect(await page.evaluate(() => localStorage.length)).toBe(0);
    await signIn(page, url, engram.tenant.writer);
  });
});

/** Every view, each with what to wait for before looking at it. */
function everyView(p: Page): [string, string, () => Promise<unknown>][] {
  return [
    ["live feed", "/", () => p.locator(".feed-item").first().waitFor()],
    ["conversations", "/conversations", () => p.getByRole("link", { name: "trip", exact: true }).waitFor()],
    [
      "conversation",
      `/conversations/${trip.conversationId}`,
      async () => {
        await p.locator("table.messages tbody tr").first().waitFor();
        await p.getByRole("button", { name: "Assemble" }).click();
        await p.getByTestId("block-TAIL").waitFor();
      },
    ],
    ["users", "/users", () => p.getByRole("link", { name: "ada" }).waitFor()],
    ["user", `/users/${trip.endUserId}`, () => p.getByTestId("fact").first().waitFor()],
    ["entries and events", "/memory", () => p.getByRole("cell", { name: /decision/ }).first().waitFor()],
    ["search", "/search?q=target", () => p.getByTestId("search-hits").waitFor()],
    ["costs and jobs", "/costs", () => p.getByRole("heading", { level: 1 }).waitFor()],
  ];
}

describe("on a phone (390 × 844)", () => {
  it("no view scrolls sideways, the header is compact, and axe finds no violations", async () => {
    const phone = await browser.newContext({ viewport: PHONE, isMobile: true, hasTouch: true });
    const p = await phone.newPage();
    try {
      await p.goto(`${url}/inspector/`);
      await p.getByLabel("API key").waitFor();
      expect(await horizontalOverflow(p), "sign-in").toBe(0);
      expect(await axeViolations(p), "sign-in").toEqual([]);
      await signIn(p, url, engram.tenant.writer);
      await engram.gql(
        `mutation { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "decision", body: "**Moved** the target: see ${LONG_URL}", source: "crm" }) { id } }`,
        {},
        engram.tenant.writer,
      );
      for (const [name, path, ready] of everyView(p)) {
        await p.goto(`${url}/inspector${path}`);
        await ready();
        expect(await horizontalOverflow(p), name).toBe(0);
        const header = await p.locator("header.top").boundingBox();
        expect(header!.height, `${name}: header height`).toBeLessThan(110);
        expect(await axeViolations(p), name).toEqual([]);
        await p.screenshot({ path: `test/artifacts/phone-${name.replaceAll(" ", "-")}.png`, fullPage: true });
        await p.screenshot({ path: `test/artifacts/phone-${name.replaceAll(" ", "-")}.screen.png` });
      }
    } finally {
      await phone.close();
    }
  });
});

describe("at 1440 × 900", () => {
  it("axe finds no violations on any view, Markdown is rendered (not raw, no HTML), and chart text stays 11 px", async () => {
    for (const [name, path, ready] of everyView(page)) {
      await page.goto(`${url}/inspector${path}`);
      await ready();
      expect(await axeViolations(page), name).toEqual([]);
      await page.screenshot({ path: `test/artifacts/desktop-${name.replaceAll(" ", "-")}.png`, fullPage: true });
    }
    await engram.gql(
      `mutation { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "note", body: "A **bold** move <img src=x onerror=alert(1)> [x](javascript:alert(1))", source: "crm" }) { id } }`,
      {},
      engram.tenant.writer,
    );
    await page.goto(`${url}/inspector/memory`);
    const cell = page.getByRole("cell", { name: /A bold move/ }).first();
    await cell.waitFor();
    expect(await cell.locator("strong").textContent()).toBe("bold");
    expect(await cell.locator("img").count()).toBe(0);
    expect(await cell.locator('a[href^="javascript"]').count()).toBe(0);
    expect(await cell.textContent()).not.toContain("**");

    await page.goto(`${url}/inspector/conversations/${trip.conversationId}`);
    const label = page.locator("figure.chart text.axis").first();
    await label.waitFor();
    expect(await label.evaluate((el) => el.getBoundingClientRect().height)).toBeLessThan(16);
  });
});
