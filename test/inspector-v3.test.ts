import { readFileSync } from "node:fs";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forTenant } from "../src/db.ts";
import { applyCandidate } from "../src/memory/facts/facts.ts";
import { axeViolations, DESKTOP, ensureInspectorBuilt, horizontalOverflow, launchChromium, PHONE, poll, signIn } from "./helpers/browser.ts";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";
import { startPrefixProxy } from "./helpers/prefix-proxy.ts";
import { say } from "./helpers/recall.ts";

// Issue 16's additions in Chromium: memory search across users, contradiction resolution,
// provenance links, export, entry and agent-settings editing, deleting a conversation, and the
// context-window bar; at desktop and phone sizes, with axe.

let engram: TestEngram;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let url: string;
let ada = { endUserId: "", conversationId: "" };
let bea = { endUserId: "", conversationId: "" };
let cy = { endUserId: "", conversationId: "" };
let scratch = { conversationId: "" };
let pair = { older: "", newer: "" };
let entryId = "";

/** A fact as the extractor writes it, from one of the user's messages. */
async function extracted(endUserId: string, conversationId: string, text: string, seq: number | null, contradicts?: string) {
  const db = forTenant(engram.services.db, engram.tenant.tenantId);
  const message = seq ? await db.message.findFirstOrThrow({ where: { conversationId, seq } }) : null;
  const outcome = await applyCandidate(db, engram.services, {
    endUserId,
    candidate: { text, core: false, seq },
    judgment: {
      durability: "durable",
      relation: contradicts ? "contradiction" : "none",
      relatedFactId: contradicts ?? null,
      sensitivity: null,
    },
    allowSensitive: false,
    sourceMessageId: message?.id ?? null,
    conversationId,
  });
  return outcome.factId!;
}

beforeAll(async () => {
  await ensureInspectorBuilt();
  engram = await startTestEngram();
  url = await engram.listen();
  const w = engram.tenant.writer;
  ada = await say(engram, { user: "ada", conversation: "trip", agent: "concierge" }, "I only stay near the harbour.", "Noted.", w);
  for (let n = 2; n <= 4; n++) await say(engram, { user: "ada", conversation: "trip", agent: "concierge" }, `Message ${n}.`, `Reply ${n}.`, w);
  bea = await say(engram, { user: "bea", conversation: "flat", agent: "broker" }, "The harbour flat was too loud.", "Sure.", w);
  cy = await say(engram, { user: "cy", conversation: "notes", agent: "concierge" }, "I cycle to work.", "Nice.", w);
  await extracted(cy.endUserId, cy.conversationId, "Cycles to work.", 1);
  scratch = await say(engram, { user: "ada", conversation: "scratch", agent: "concierge" }, "Just testing.", "Ok.", w);
  await extracted(ada.endUserId, ada.conversationId, "Only stays near the harbour.", 1);
  await extracted(bea.endUserId, bea.conversationId, "Found the harbour flat too loud.", 1);
  const older = await extracted(ada.endUserId, ada.conversationId, "Is vegetarian.", null);
  pair = { older, newer: await extracted(ada.endUserId, ada.conversationId, "Eats fish now.", 3, older) };
  const entry = await engram.gql(
    `mutation { createEntry(input: { scope: ENTITY, scopeRef: "ada", title: "Harbour hotels", summary: "Ada's **shortlist** of harbour hotels.", tags: ["travel"], importance: 3 }) { id } }`,
    {},
    w,
  );
  entryId = entry.data.createEntry.id;
  await engram.gql(
    `mutation { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "decision", body: "Moved the harbour campaign to May.", source: "crm" }) { id } }`,
    {},
    w,
  );
  browser = await launchChromium();
  context = await browser.newContext({ viewport: DESKTOP, acceptDownloads: true });
  page = await context.newPage();
  await signIn(page, url, w);
}, 180_000);

afterAll(async () => {
  await browser?.close();
  await engram?.stop();
});

const hits = (p: Page = page) => p.getByTestId("search-hits").locator("li");

describe("a link into a long conversation", () => {
  it("opens a window around a message 600 back, marked, with older and newer messages a click away", async () => {
    const messages = Array.from({ length: 650 }, (_, i) => ({ role: i % 2 ? "ASSISTANT" : "USER", content: `Long message ${i + 1}.` }));
    const imported = await engram.gql(
      `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id } }`,
      { input: { agentExternalId: "concierge", endUserExternalId: "dee", conversationExternalId: "long", messages } },
      engram.tenant.writer,
    );
    expect(imported.errors).toBeUndefined();
    const id = imported.data.importConversation.id;
    const rows = page.locator("table.messages tbody tr[id^=message-]");
    const seqs = async () => (await rows.evaluateAll((trs) => trs.map((tr) => Number(tr.id.slice("message-".length))))) as number[];

    // Before, only the newest 200 came, #5 was not among them and nothing was marked.
    await page.goto(`${url}/inspector/conversations/${id}?message=5`);
    const focused = page.locator('table.messages tr[aria-current="true"]');
    await focused.waitFor();
    expect(await focused.textContent()).toContain("Long message 5.");
    // Newest first, as the table lists them.
    expect(await seqs()).toEqual(Array.from({ length: 15 }, (_, i) => 15 - i));
    expect(await page.getByRole("button", { name: "Load older messages" }).count()).toBe(0);
    await page.getByRole("button", { name: "Load newer messages" }).click();
    await poll(async () => (await seqs())[0]).toBe(55);
    // Newer messages are added, as older ones are: the linked message stays in view, marked
    // (the window slid to 16–55 before, and #5 left the page).
    expect(await seqs()).toEqual(Array.from({ length: 55 }, (_, i) => 55 - i));
    expect(await focused.textContent()).toContain("Long message 5.");

    // From the newest, "Load older" goes on past the API's page of 500: the window moves back.
    await page.goto(`${url}/inspector/conversations/${id}`);
    await poll(async () => (await seqs())[0]).toBe(650);
    // 11 clicks grow the window to 480 messages (171–650), the next 5 move it back to 1–450.
    for (let clicks = 0; (await seqs()).at(-1)! > 1; clicks++) {
      expect(clicks).toBeLessThan(16);
      const before = (await seqs()).at(-1)!;
      await page.getByRole("button", { name: "Load older messages" }).click();
      await poll(async () => (await seqs()).at(-1)).toBeLessThan(before);
    }
    expect(await page.getByRole("button", { name: "Load older messages" }).count()).toBe(0);
    expect((await seqs()).length).toBeLessThanOrEqual(500);
    await page.getByRole("button", { name: "Load newer messages" }).waitFor();
  }, 120_000);
});

describe("memory search across users", () => {
  it("finds facts, entries and events of every user, keeps the search in the URL, and filters by kind and user", async () => {
    await page.getByRole("link", { name: "Search" }).click();
    await page.getByRole("searchbox").fill("harbour");
    await page.getByRole("button", { name: "Search" }).click();
    await poll(() => hits().count()).toBe(4);
    const kinds = await hits().evaluateAll((items) => items.map((i) => (i as HTMLElement).dataset.kind).sort());
    expect(kinds).toEqual(["ENTRY", "EVENT", "FACT", "FACT"]);
    expect(new URL(page.url()).searchParams.get("q")).toBe("harbour");

    await page.reload();
    await poll(() => hits().count()).toBe(4);
    await page.getByLabel("Facts").check();
    await poll(() => hits().count()).toBe(2);
    await page.getByLabel("User").selectOption({ label: "bea" });
    await poll(() => hits().count()).toBe(1);
    expect(await hits().first().textContent()).toContain("Found the harbour flat too loud.");
    expect(new URL(page.url()).searchParams.get("kinds")).toBe("FACT");
    expect(new URL(page.url()).searchParams.get("user")).toBe(bea.endUserId);

    await page.goto(`${url}/inspector/search?q=${encodeURIComponent("no such thing anywhere")}`);
    await page.getByText(/Nothing in memory matches/).waitFor();
  });

  it("links a fact to the message it came from, and an entry to its scope", async () => {
    await page.goto(`${url}/inspector/search?q=harbour&user=${ada.endUserId}`);
    await poll(() => hits().count()).toBe(2);
    await hits().filter({ hasText: "Only stays near the harbour." }).getByRole("link", { name: "trip #1" }).click();
    // The conversation view: its own heading (other headings may name the conversation too).
    await page.getByRole("heading", { name: /trip/ }).first().waitFor();
    const focused = page.locator('table.messages tr[aria-current="true"]');
    await focused.waitFor();
    expect(await focused.textContent()).toContain("I only stay near the harbour.");

    await page.goBack();
    await hits().filter({ hasText: "Harbour hotels" }).getByRole("link", { name: "entity / ada" }).click();
    await page.getByTestId("entry").filter({ hasText: "Harbour hotels" }).waitFor();
    expect(await page.getByLabel("Scope ref").first().inputValue()).toBe("ada");
  });
});

describe("on the user's page", () => {
  it("shows where a fact came from (the date the user said it, the full quote, a link), and drops the quote once a person corrects it", async () => {
    await page.goto(`${url}/inspector/users/${ada.endUserId}`);
    const fact = page.getByTestId("fact").filter({ hasText: "Only stays near the harbour." });
    await fact.waitFor();
    await fact.getByText(/Said on .* \(message #1\)/).click();
    expect(await fact.locator("blockquote").textContent()).toBe("I only stay near the harbour.");
    await fact.getByRole("link", { name: "Open message #1 in its conversation" }).click();
    await page.locator('table.messages tr[aria-current="true"]').waitFor();
    expect(new URL(page.url()).pathname).toBe(`/inspector/conversations/${ada.conversationId}`);

    await page.goBack();
    await fact.getByRole("button", { name: "Edit" }).click();
    await page.getByLabel("Fact text").fill("Only stays within walking distance of the harbour.");
    await page.getByRole("button", { name: "Save" }).click();
    const corrected = page.getByTestId("fact").filter({ has: page.locator(".fact-text", { hasText: "walking distance" }) });
    await corrected.getByRole("button", { name: "Edit" }).waitFor();
    expect(await corrected.locator("blockquote").count()).toBe(0);
    expect(await corrected.textContent()).toMatch(/corrected by/);
  });

  it("resolves a contradiction after asking which fact is true, and the history says so", async () => {
    await page.goto(`${url}/inspector/users/${ada.endUserId}`);
    const newer = page.getByTestId("fact").filter({ has: page.locator(".fact-text", { hasText: "Eats fish now." }) });
    const older = () => page.getByTestId("fact").filter({ has: page.locator(".fact-text", { hasText: "Is vegetarian." }) });
    await newer.waitFor();
    expect(await newer.textContent()).toContain("contradicts “Is vegetarian.”");
    await newer.getByRole("button", { name: "Resolve…" }).click();
    const dialog = page.getByRole("alertdialog", { name: "Resolve this contradiction" });
    await dialog.getByRole("button", { name: "Cancel" }).click();
    expect(await dialog.count()).toBe(0);
    expect(await older().count()).toBe(1);

    await newer.getByRole("button", { name: "Resolve…" }).click();
    await dialog.getByRole("button", { name: "Keep this one" }).click();
    await poll(() => older().count()).toBe(0);
    await poll(async () => (await newer.textContent()) ?? "").not.toContain("contradicts");
    expect(await newer.getByRole("button", { name: "Resolve…" }).count()).toBe(0);
    await newer.getByRole("button", { name: "History" }).click();
    await newer.getByText(/resolved: Eats fish now\. \(contradiction resolved: kept over the other fact\)/).waitFor();
  });

  it("exports the user's memory as a JSON file for an admin key, and shows no export to a writer", async () => {
    expect(await page.getByRole("button", { name: "Export as JSON" }).count()).toBe(0);
    await signIn(page, url, engram.tenant.admin);
    await page.goto(`${url}/inspector/users/${ada.endUserId}`);
    const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("button", { name: "Export as JSON" }).click()]);
    expect(download.suggestedFilename()).toBe("engram-export-ada.json");
    const exported = JSON.parse(readFileSync((await download.path())!, "utf8"));
    expect(exported.endUser.externalId).toBe("ada");
    expect(exported.facts.map((f: { text: string }) => f.text)).toContain("Eats fish now.");
    expect(exported.conversations.map((c: { externalId: string }) => c.externalId).sort()).toEqual(["scratch", "trip"]);
    expect(exported.entries.map((e: { title: string }) => e.title)).toEqual(["Harbour hotels"]);
    await signIn(page, url, engram.tenant.writer);
  });
});

describe("behind a reverse proxy that serves Engram under a path prefix", () => {
  it("loads, reads, listens, follows its links and exports, all under the prefix", async () => {
    const proxy = await startPrefixProxy(url, "/engram");
    const behind = await context.newPage();
    const outside: string[] = [];
    behind.on("request", (request) => {
      if (!new URL(request.url()).pathname.startsWith("/engram/")) outside.push(request.url());
    });
    try {
      await signIn(behind, proxy.url, engram.tenant.admin);
      // A deep link: its page climbs back to the assets, and the API is found under the prefix.
      await behind.goto(`${proxy.url}/inspector/users/${bea.endUserId}`);
      const fact = behind.getByTestId("fact").filter({ hasText: "Found the harbour flat too loud." });
      await fact.getByText(/Said on .* \(message #1\)/).click();
      await fact.getByRole("link", { name: "Open message #1 in its conversation" }).click();
      await behind.locator('table.messages tr[aria-current="true"]').waitFor();
      expect(new URL(behind.url()).pathname).toBe(`/engram/inspector/conversations/${bea.conversationId}`);
      // The conversation listens for new messages over the WebSocket, through the proxy too.
      await poll(() => behind.getByTestId("live-status").textContent()).toBe("Live");
      await behind.goto(`${proxy.url}/inspector/users/${bea.endUserId}`);
      const [download] = await Promise.all([behind.waitForEvent("download"), behind.getByRole("button", { name: "Export as JSON" }).click()]);
      expect(JSON.parse(readFileSync((await download.path())!, "utf8")).endUser.externalId).toBe("bea");
      expect(outside).toEqual([]);
    } finally {
      await behind.close();
      await proxy.stop();
    }
  });
});

describe("banners go when their cause goes (bug 6)", () => {
  it("after Cancel, and after Forget everything", async () => {
    await page.goto(`${url}/inspector/users/${cy.endUserId}`);
    const fact = page.getByTestId("fact").first();
    await fact.getByRole("button", { name: "Edit" }).click();
    await page.getByLabel("Fact text").fill("ab");
    await page.getByRole("button", { name: "Save" }).click();
    await page.getByRole("alert").waitFor();
    await page.getByRole("button", { name: "Cancel" }).click();
    await poll(() => page.getByRole("alert").count()).toBe(0);

    await page.getByLabel("New fact").fill("x".repeat(600));
    await page.getByRole("button", { name: "Add fact" }).click();
    await page.getByRole("alert").waitFor();
    await page.getByRole("button", { name: "Forget everything…" }).click();
    await page.getByLabel("Confirm the user's id").fill("cy");
    await page.getByRole("button", { name: "Forget cy" }).click();
    await page.getByText("Nothing is known about this user.").waitFor();
    await poll(() => page.getByRole("alert").count()).toBe(0);
    expect(await page.getByLabel("New fact").inputValue()).toBe("");
  });

  it("Forget everything says beforehand that the messages go too, and afterwards all that went", async () => {
    const w = engram.tenant.writer;
    const dee = await say(engram, { user: "dee", conversation: "move", agent: "concierge" }, "I live in Lyon now.", "Noted.", w);
    await engram.gql(`mutation($id: ID!) { addFact(input: { endUserId: $id, text: "Lives in Lyon." }) { id } }`, { id: dee.endUserId }, w);
    await signIn(page, url, w);
    await page.goto(`${url}/inspector/users/${dee.endUserId}`);
    await page.getByTestId("fact").first().waitFor();
    await page.getByRole("button", { name: "Forget everything…" }).click();
    // It said "Their conversations stay." while the tenant's default deletes the messages.
    const warning = await page.getByRole("alertdialog").textContent();
    expect(warning).toContain("their messages");
    expect(warning).not.toContain("conversations stay.");
    await page.getByLabel("Confirm the user's id").fill("dee");
    await page.getByRole("button", { name: "Forget dee" }).click();
    const done = page.getByRole("status").filter({ hasText: /^Forgot / });
    await done.waitFor();
    // It said only "Forgot 1 facts and 0 recall snippets."
    expect(await done.textContent()).toMatch(/^Forgot 1 facts, .*2 messages/);
    const left = await engram.gql(`query($id: ID!) { conversation(id: $id) { messages(last: 5) { edges { node { seq } } } } }`, { id: dee.conversationId }, w);
    expect(left.data.conversation.messages.edges).toEqual([]);
  });
});

describe("editing where people expect it", () => {
  it("corrects an entry's title, summary, tags and importance; Escape cancels; a reader gets no Edit", async () => {
    await page.goto(`${url}/inspector/memory`);
    const card = page.getByTestId("entry").filter({ hasText: "Harbour hotels" });
    await card.getByRole("button", { name: "Edit" }).click();
    await card.getByLabel("Title").fill("Something else");
    await card.getByLabel("Title").press("Escape");
    await card.getByRole("button", { name: "Edit" }).waitFor();
    expect(await card.textContent()).toContain("Harbour hotels");

    await card.getByRole("button", { name: "Edit" }).click();
    // While it is edited the card's text is the form's: find the form by its name.
    const form = page.getByRole("form", { name: "Edit entry Harbour hotels" });
    await form.getByLabel("Title").fill("Harbour hotels, checked");
    await form.getByLabel("Summary (Markdown)").fill("Two **quiet** ones left.");
    await form.getByLabel("Tags (comma separated)").fill("travel, quiet");
    await form.getByLabel("Importance").selectOption("5");
    await form.getByRole("button", { name: "Save entry" }).click();
    const saved = page.getByTestId("entry").filter({ hasText: "Harbour hotels, checked" });
    await saved.waitFor();
    expect(await saved.locator("strong").textContent()).toBe("quiet");
    expect(await saved.textContent()).toContain("importance 5");
    const { data } = await engram.gql(`query($id: ID!) { entry(id: $id) { title tags importance } }`, { id: entryId });
    expect(data.entry).toEqual({ title: "Harbour hotels, checked", tags: ["travel", "quiet"], importance: 5 });

    await signIn(page, url, engram.tenant.reader);
    await page.goto(`${url}/inspector/memory`);
    await page.getByTestId("entry").first().waitFor();
    expect(await page.getByTestId("entry").getByRole("button", { name: "Edit" }).count()).toBe(0);
    await page.goto(`${url}/inspector/conversations/${ada.conversationId}`);
    await page.getByRole("heading", { name: "Memory settings of concierge" }).waitFor();
    expect(await page.getByRole("button", { name: "Save settings" }).count()).toBe(0);
    // An agent's settings are the tenant's policy: a writer sees them read-only too.
    await signIn(page, url, engram.tenant.writer);
    await page.goto(`${url}/inspector/conversations/${ada.conversationId}`);
    await page.getByRole("heading", { name: "Memory settings of concierge" }).waitFor();
    expect(await page.getByRole("button", { name: "Save settings" }).count()).toBe(0);
    await signIn(page, url, engram.tenant.admin);
  });

  it("changes the agent's memory settings from the conversation view, sending only what changed", async () => {
    await page.goto(`${url}/inspector/conversations/${ada.conversationId}`);
    const form = page.getByRole("form", { name: "Memory settings of concierge" });
    await form.waitFor();
    expect(await form.getByRole("button", { name: "Save settings" }).isDisabled()).toBe(true);
    await form.getByLabel("Tail (messages sent word for word)").fill("4");
    await form.getByLabel("Recall earlier conversations").uncheck();
    await form.getByRole("button", { name: "Save settings" }).click();
    await form.getByRole("status").waitFor();
    await poll(() => page.locator(".lede").textContent()).toContain("tail 4");
    const { data } = await engram.gql(`{ agents { externalId settings { tailSize recallOn summaryOn historySize } } }`);
    expect(data.agents.find((a: { externalId: string }) => a.externalId === "concierge").settings).toEqual({
      tailSize: 4,
      recallOn: false,
      summaryOn: true,
      historySize: 20,
    });
  });

  it("shows the assembled context against the model window the person picks, next to the baseline", async () => {
    await page.goto(`${url}/inspector/conversations/${ada.conversationId}`);
    await page.getByRole("button", { name: "Assemble" }).click();
    const bar = page.getByTestId("context-window");
    await bar.waitFor();
    const segments = bar.locator(".window-segment[data-kind]");
    const blocks = await page.locator("[data-testid^=block-]").count();
    expect(await segments.count()).toBe(blocks);
    const total = Number((await page.getByTestId("context-totals").locator("strong").first().textContent())!);
    const tokens = await segments.evaluateAll((s) => s.map((e) => Number((e as HTMLElement).dataset.tokens)));
    expect(tokens.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    expect(await bar.textContent()).toContain(`Sent: ${total} tokens`);
    const width = () => segments.evaluateAll((s) => s.reduce((sum, e) => sum + e.getBoundingClientRect().width, 0));
    const at8k = await width();
    await bar.getByLabel("Model window").selectOption("2000");
    await page.getByRole("region", { name: "Context for the next call" }).screenshot({ path: "test/artifacts/desktop-context-window.png" });
    await bar.getByLabel("Model window").selectOption("128000");
    await poll(async () => Math.round((at8k / (await width())) * 10) / 10).toBeGreaterThan(10);
    expect(await bar.textContent()).toContain("of 128k");
    expect(await bar.getByTestId("baseline-segment").count()).toBe(1);
    // The choice stays for the next conversation opened.
    await page.reload();
    await page.getByRole("button", { name: "Assemble" }).click();
    await poll(() => page.getByTestId("context-window").getByLabel("Model window").inputValue()).toBe("128000");
  });

  it("deletes a conversation only after a confirmation, through forgetting, and the user's page records it", async () => {
    const factId = await extracted(ada.endUserId, scratch.conversationId, "Was only testing.", 1);
    await page.goto(`${url}/inspector/conversations/${scratch.conversationId}`);
    await page.getByRole("button", { name: "Delete conversation…" }).click();
    await page.getByRole("button", { name: "Keep it" }).click();
    expect(await page.getByRole("alertdialog").count()).toBe(0);
    await page.getByRole("button", { name: "Delete conversation…" }).click();
    // It said "the user's facts stay", and the fact extracted from the conversation went.
    const warning = await page.getByRole("alertdialog").textContent();
    expect(warning).toContain("the facts extracted from its messages go");
    expect(warning).not.toContain("the user's facts stay");
    await page.getByRole("button", { name: "Delete “scratch”" }).click();
    await page.getByRole("status").filter({ hasText: "Deleted “scratch”: 2 messages, 0 recall snippets and 1 facts extracted from it." }).waitFor();
    const facts = await engram.gql(`query($id: ID!) { facts(endUserId: $id) { id } }`, { id: ada.endUserId });
    expect(facts.data.facts.map((f: { id: string }) => f.id)).not.toContain(factId);
    const { errors } = await engram.gql(`query($id: ID!) { conversation(id: $id) { id } }`, { id: scratch.conversationId });
    expect(errors?.[0].extensions?.code).toBe("NOT_FOUND");
    await page.getByRole("link", { name: "Back to the user" }).click();
    await page.getByTestId("forget-records").waitFor();
    expect(await page.getByTestId("forget-records").textContent()).toMatch(/conversation · asked by key .*2 messages/);
    expect(await page.getByRole("link", { name: "scratch" }).count()).toBe(0);
  });
});

/** Pairs of chart labels whose boxes overlap (bug 9: labels collided). */
const overlappingChartLabels = (p: Page) =>
  p.evaluate(() => {
    const boxes = [...document.querySelectorAll("figure.chart text.axis")].map((t) => ({ text: t.textContent, r: t.getBoundingClientRect() }));
    const hits: string[] = [];
    for (let i = 0; i < boxes.length; i++)
      for (let j = i + 1; j < boxes.length; j++) {
        const [a, b] = [boxes[i].r, boxes[j].r];
        if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) hits.push(`${boxes[i].text} × ${boxes[j].text}`);
      }
    return hits;
  });

/** The views this file added to, each with what to wait for before looking at it. */
function newViews(p: Page): [string, string, () => Promise<unknown>][] {
  return [
    ["search", "/search?q=harbour", () => p.getByTestId("search-hits").waitFor()],
    [
      "user with a dialog",
      `/users/${bea.endUserId}`,
      async () => {
        await p.getByTestId("fact").first().waitFor();
        await p.getByRole("button", { name: "Delete" }).first().click();
      },
    ],
    [
      "conversation with the window bar",
      `/conversations/${ada.conversationId}`,
      async () => {
        await p.getByRole("button", { name: "Assemble" }).click();
        await p.getByTestId("context-window").waitFor();
        await p.getByRole("button", { name: "Delete conversation…" }).click();
      },
    ],
    [
      "entry being edited",
      "/memory",
      async () => {
        await p.getByTestId("entry").first().getByRole("button", { name: "Edit" }).click();
        await p.getByRole("button", { name: "Save entry" }).waitFor();
      },
    ],
  ];
}

describe("sizes and axe", () => {
  it("at 390 × 844 nothing scrolls sideways and axe finds nothing; at 1440 × 900 axe finds nothing", async () => {
    const phone = await browser.newContext({ viewport: PHONE, isMobile: true, hasTouch: true });
    const p = await phone.newPage();
    try {
      await signIn(p, url, engram.tenant.writer);
      for (const [name, path, ready] of newViews(p)) {
        await p.goto(`${url}/inspector${path}`);
        await ready();
        expect(await horizontalOverflow(p), name).toBe(0);
        expect(await overlappingChartLabels(p), name).toEqual([]);
        expect(await axeViolations(p), name).toEqual([]);
        await p.screenshot({ path: `test/artifacts/phone-${name.replaceAll(" ", "-")}.png`, fullPage: true });
      }
    } finally {
      await phone.close();
    }
    for (const [name, path, ready] of newViews(page)) {
      await page.goto(`${url}/inspector${path}`);
      await ready();
      expect(await axeViolations(page), name).toEqual([]);
      await page.screenshot({ path: `test/artifacts/desktop-${name.replaceAll(" ", "-")}.png`, fullPage: true });
    }
  });
});

describe("many users", () => {
  it("lists every user, 100 at a time, not only the 100 most recently active", async () => {
    const upsert = `mutation($e: String!) { upsertEndUser(input: { externalId: $e }) { id } }`;
    for (let n = 1; n <= 100; n++) {
      const { errors } = await engram.gql(upsert, { e: `many-${String(n).padStart(3, "0")}` }, engram.tenant.writer);
      expect(errors).toBeUndefined();
    }
    const { data } = await engram.gql(`{ endUsers(first: 100) { edges { node { id } } } }`);
    const total = 100 + (await engram.services.db.endUser.count({ where: { tenantId: engram.tenant.tenantId, externalId: { not: { startsWith: "many-" } } } }));
    expect(data.endUsers.edges).toHaveLength(100);
    await page.goto(`${url}/inspector/users`);
    const listed = page.getByTestId("users").locator("li");
    await poll(() => listed.count()).toBe(100);
    // The page stopped here: ada, the oldest, could not be reached from the list.
    expect(await page.getByRole("link", { name: "ada", exact: true }).count()).toBe(0);
    await page.getByRole("button", { name: "More users" }).click();
    await poll(() => listed.count()).toBe(total);
    await page.getByRole("link", { name: "ada", exact: true }).click();
    await poll(() => page.locator("#user-title").textContent()).toBe("ada");
    expect(await page.getByRole("button", { name: "More users" }).count()).toBe(0);
  });
});

describe("many conversations", () => {
  it("lists every conversation, 100 at a time, and starts again when the filter changes", async () => {
    const message = [{ role: "USER", content: "Hello." }];
    const imported = `mutation($input: ImportConversationInput!) { importConversation(input: $input) { id } }`;
    for (let n = 1; n <= 100; n++) {
      const input = { agentExternalId: "bulk", endUserExternalId: "bulk-user", conversationExternalId: `bulk-${String(n).padStart(3, "0")}`, messages: message };
      expect((await engram.gql(imported, { input }, engram.tenant.writer)).errors).toBeUndefined();
    }
    const total = await engram.services.db.conversation.count({ where: { tenantId: engram.tenant.tenantId } });
    expect(total).toBeGreaterThan(100);
    await page.goto(`${url}/inspector/conversations`);
    const rows = page.locator("table tbody tr");
    await poll(() => rows.count()).toBe(100);
    // The list stopped here: the oldest conversations (ada's trip) could not be reached from it.
    expect(await page.getByRole("link", { name: "trip", exact: true }).count()).toBe(0);
    await page.getByRole("button", { name: "More conversations" }).click();
    await poll(() => rows.count()).toBe(total);
    expect(await page.getByRole("button", { name: "More conversations" }).count()).toBe(0);
    // Another filter is another list, from its first page.
    const concierge = await engram.services.db.agent.findFirstOrThrow({ where: { tenantId: engram.tenant.tenantId, externalId: "concierge" } });
    await page.getByLabel("Agent").selectOption(concierge.id);
    await poll(() => rows.count()).toBe(await engram.services.db.conversation.count({ where: { agentId: concierge.id } }));
    await page.getByRole("link", { name: "trip", exact: true }).waitFor();

    // The user picker lists the 100 most recently active (ada, among the oldest, is not one of
    // them); anyone is found by their own id.
    await page.getByLabel("Agent").selectOption("");
    expect(await page.getByLabel("User").locator("option", { hasText: /^ada$/ }).count()).toBe(0);
    await page.getByLabel("Find by id").fill("nobody-at-all");
    await page.getByLabel("Find by id").press("Enter");
    await page.getByText("No user nobody-at-all.").waitFor();
    await page.getByLabel("Find by id").fill("ada");
    await page.getByLabel("Find by id").press("Enter");
    await poll(() => rows.count()).toBe(await engram.services.db.conversation.count({ where: { endUserId: ada.endUserId } }));
    expect(await page.getByLabel("User").inputValue()).toBe(ada.endUserId);
  });
});
