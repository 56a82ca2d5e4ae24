import { existsSync, mkdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { ensureInspectorBuilt, launchChromium, signIn } from "./helpers/browser.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildApp, type App } from "../src/app.ts";
import { startEngramWithModel, type TestEngram } from "./helpers/engram.ts";
import { bagOfWords } from "./helpers/fake-embeddings.ts";
import { startModelServer, type ChatRequest, type ModelServer } from "./helpers/model-server.ts";
import { allIndexed, say } from "./helpers/recall.ts";
import { until } from "./helpers/until.ts";
import { factsScript, memoryScript, rerankSnippets, seqsIn } from "./helpers/scripted-memory-model.ts";

// The inspector in Debian's chromium, driven by playwright-core, against a real Engram on a free
// port with its job worker and a scripted model server, so summaries and recalls really happen.
const root = fileURLToPath(new URL("..", import.meta.url));
const artifacts = path.join(root, "test/artifacts");
const CHROMIUM = process.env.ENGRAM_TEST_CHROMIUM ?? "/usr/bin/chromium";
// A machine without chromium skips the browser tests, loudly; CI (ENGRAM_REQUIRE_BROWSER=1) fails instead.
const browserMissing = !existsSync(CHROMIUM);
if (browserMissing) {
  const line = `inspector browser tests SKIPPED: no chromium at ${CHROMIUM}. Run \`npm run setup:browser\` (as root it installs Debian's chromium) or set ENGRAM_TEST_CHROMIUM.`;
  if (process.env.ENGRAM_REQUIRE_BROWSER === "1") throw new Error(`ENGRAM_REQUIRE_BROWSER=1 and ${line}`);
  console.warn(`\n!!! ${line}\n`);
}

const isRerank = (r: ChatRequest) => r.chain === "rerank";

const CONTEXT = `query($input: ContextInput!) { context(input: $input) { blocks { kind text } } }`;
const ADD_FACT = `mutation($input: AddFactInput!) { addFact(input: $input) { id text } }`;
const FACTS = `query($id: ID!) { facts(endUserId: $id) { id text } }`;

let model: ModelServer;
let engram: TestEngram;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let url: string;
let restarted: App | undefined;

beforeAll(async () => {
  if (browserMissing) return;
  mkdirSync(artifacts, { recursive: true });
  await ensureInspectorBuilt();
  model = await startModelServer();
  model.embed((input) => input.map((text) => bagOfWords(text)));
  const memory = memoryScript({ reject: (_r, call) => call === 2, essential: [1] });
  const script = factsScript({ triage: (m) => ({ needsRecall: /last time/i.test(m) }) }, memory);
  model.respond((request) => {
    if (request.chain === "summary") {
      // A readable summary (the screenshots go into the README); the loss judge still rejects the second.
      const through = seqsIn(request, "Newly folded messages:\n").at(-1) ?? 2;
      const options = Math.max(2, Math.ceil(through / 2));
      return JSON.stringify({
        summary:
          `Ada's budget is 400 EUR; she wants a quiet room near the old harbour in Marseille. ` +
          `Hotel options 2 to ${options} were compared: all include breakfast and free cancellation, ` +
          `ten minutes from the station, from 102 to ${100 + options} EUR a night. (Through #${through}.)`,
      });
    }
    if (!isRerank(request)) return script(request);
    // The judge keeps the turn with the user's budget and harbour wish.
    return JSON.stringify({ scores: rerankSnippets(request).map(({ id, text }) => ({ id, score: /harbour/.test(text) && /^user:/.test(text) ? 3 : 0 })) });
  });
  ({ engram } = await startEngramWithModel({ model, worker: true, env: { ENGRAM_EMBEDDING_MODEL: "scripted-embed" } }));
  url = await engram.listen();
  browser = await launchChromium();
  context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  page = await context.newPage();
}, 180_000);

afterAll(async () => {
  await browser?.close();
  await restarted?.stop();
  await engram?.stop();
  await model?.stop();
});

/** A full-page screenshot, plus one of the first screen (the README's copies are made from those). */
async function shot(name: string) {
  await page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
  await page.screenshot({ path: path.join(artifacts, `${name}.screen.png`) });
}

const turn = (conversation: string, n: number, user = "ada") =>
  say(
    engram,
    { user, conversation, agent: "concierge" },
    n === 1
      ? "My budget is 400 EUR and I want a quiet room near the old harbour in Marseille."
      : `Question ${n}: what about hotel option ${n}? Compare breakfast, cancellation and the walk to the station.`,
    `Answer ${n}: option ${n} costs ${100 + n} EUR a night, breakfast included, free cancellation, ten minutes to the station.`,
    engram.tenant.writer,
  );

describe.skipIf(browserMissing)("the inspector", () => {
  let conversationId = "";
  let endUserId = "";

  it("is served at /inspector with the right content types and a fallback for its own routes", async () => {
    const index = await fetch(`${url}/inspector/conversations/anything`);
    expect(index.status).toBe(200);
    expect(index.headers.get("content-type")).toBe("text/html; charset=utf-8");
    const html = await index.text();
    // Linked relatively (a proxy may serve Engram under a prefix), climbing back from this depth.
    const script = html.match(/src="(\.\.\/assets\/[^"]+\.js)"/)![1];
    const js = await fetch(new URL(script, `${url}/inspector/conversations/anything`));
    expect(js.status).toBe(200);
    expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect((await fetch(`${url}/inspector/assets/missing.js`)).status).toBe(404);
    expect((await fetch(`${url}/inspector/..%2f..%2fpackage.json`)).status).toBe(404);
    expect((await fetch(`${url}/inspector`, { redirect: "manual" })).headers.get("location")).toBe("inspector/");
    // Nothing from elsewhere: every script and stylesheet is ours.
    expect(html).not.toMatch(/https?:\/\//);
  });

  it("signs in with a key, and refuses a bad one", async () => {
    await page.goto(`${url}/inspector/`);
    await page.getByLabel("API key").fill("egm_not-a-real-key");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("That key was refused");
    await shot("sign-in-refused");
    expect(await page.evaluate(() => localStorage.length + sessionStorage.length)).toBe(0);

    await signIn(page, url, engram.tenant.writer);
    expect(await page.getByTestId("role").textContent()).toBe("writer");
    await expect.poll(() => page.getByTestId("live-status").textContent()).toBe("Live");
    // The key survives a reload (it is in this origin's local storage).
    await page.reload();
    await page.getByRole("navigation", { name: "Sections" }).waitFor();
  });

  it("shows recorded turns, their summary revisions (accepted and rejected) and a recall live, without a reload", async () => {
    await page.getByRole("link", { name: "Live feed" }).click();
    await page.evaluate(() => ((window as unknown as { marker: number }).marker = 42));
    await expect.poll(() => page.getByTestId("live-status").textContent()).toBe("Live");

    for (let n = 1; n <= 4; n++) ({ conversationId, endUserId } = await turn("trip", n));
    await page.locator('[data-kind="turn"]').first().waitFor();
    await page.locator('[data-kind="summary"]', { hasText: "accepted" }).first().waitFor({ timeout: 30_000 });
    for (let n = 5; n <= 6; n++) await turn("trip", n);
    await page.locator('[data-kind="summary"]', { hasText: "Rejected: dropped the user's budget of 400 EUR" }).waitFor({ timeout: 30_000 });

    // A recall: the agent asks for context in a new conversation with the same user, once every
    // turn's follow-ups (summaries included) are done, so no revision lands after the recall.
    const next = await turn("trip-2", 1, "ada");
    await allIndexed(engram, undefined, 30_000, ["memory.summarize"]);
    await engram.gql(CONTEXT, { input: { conversationId: next.conversationId, message: "Book the same hotel as last time." } }, engram.tenant.reader);
    const recall = page.locator('[data-kind="recall"]').first();
    await recall.waitFor({ timeout: 30_000 });
    expect(await recall.textContent()).toContain("Book the same hotel as last time.");
    expect(await recall.textContent()).toMatch(/1 of \d+ chosen by judge/);

    // Newest first, and all of it without a reload.
    expect(await page.locator(".feed-item").first().getAttribute("data-kind")).toBe("recall");
    expect(await page.evaluate(() => (window as unknown as { marker?: number }).marker)).toBe(42);
    await shot("live-feed");
  });

  it("shows the conversation: summary, revisions with a diff, kept and tail messages, blocks and the token chart", async () => {
    // A rejected rewrite keeps the old summary; the next turn's rewrite catches up.
    await turn("trip", 7);
    await until("the rewrite after the rejection", async () => {
      const c = await engram.services.db.conversation.findUniqueOrThrow({ where: { id: conversationId } });
      return c.summaryThroughSeq >= 8;
    });
    await page.getByRole("link", { name: "Conversations" }).click();
    await page.getByRole("link", { name: "trip", exact: true }).click();
    await page.getByTestId("summary").waitFor();
    await page.getByRole("button", { name: "Assemble" }).click();
    expect(await page.getByTestId("summary").textContent()).toContain("(Through #8.)");
    await expect.poll(() => page.locator('[data-testid="revisions"] > li').count()).toBeGreaterThanOrEqual(2);
    expect(await page.locator('[data-testid="revisions"] .rejected').count()).toBeGreaterThanOrEqual(1);
    await page.getByText("Changes from the revision before").first().click();
    expect(await page.locator(".diff ins").count()).toBeGreaterThan(0);
    await page.getByTestId("block-TAIL").waitFor();
    expect(await page.getByTestId("block-KEPT").textContent()).toContain("score 3");
    expect(await page.getByTestId("context-totals").textContent()).toMatch(/tokens sent · baseline \d+ · saved -?\d+/);
    expect(await page.locator("figure.chart polyline").count()).toBe(2);
    await shot("conversation");
  });

  it("lets a writer add and edit a fact, and the edit is in the context", async () => {
    await engram.gql(ADD_FACT, { input: { endUserId, text: "Prefers quiet rooms.", core: true } }, engram.tenant.writer);
    await page.goto(`${url}/inspector/users/${endUserId}`);
    const fact = page.getByTestId("fact").filter({ hasText: "Prefers quiet rooms." });
    await fact.waitFor();
    await fact.getByRole("button", { name: "Edit" }).click();
    await page.getByLabel("Fact text").fill("Prefers quiet rooms facing the sea.");
    await page.getByRole("button", { name: "Save" }).click();
    await page.getByTestId("fact").filter({ hasText: "Prefers quiet rooms facing the sea." }).waitFor();

    await page.getByLabel("New fact").fill("Travels with a small dog.");
    await page.getByRole("button", { name: "Add fact" }).click();
    await page.getByTestId("fact").filter({ hasText: "Travels with a small dog." }).waitFor();
    // The changes reach the user's live feed too.
    await page.locator('[data-kind="fact"]', { hasText: "corrected" }).first().waitFor();

    const { data } = await engram.gql(CONTEXT, { input: { conversationId, message: "Which room should I book?" } }, engram.tenant.reader);
    const facts = data.context.blocks.find((b: { kind: string }) => b.kind === "FACTS");
    expect(facts.text).toContain("Prefers quiet rooms facing the sea.");
    expect(facts.text).not.toMatch(/Prefers quiet rooms\.$/m);
    await page.getByRole("button", { name: "History" }).first().click();
    await page.locator(".history li").first().waitFor();
    await shot("users");

    // The conversation view's context shows it as well.
    await page.goto(`${url}/inspector/conversations/${conversationId}`);
    await page.getByRole("button", { name: "Assemble" }).click();
    await expect.poll(() => page.getByTestId("block-FACTS").textContent()).toContain("Prefers quiet rooms facing the sea.");
  });

  it("shows a reader the facts without edit controls", async () => {
    const readerPage = await context.newPage();
    const writerPage = page;
    page = readerPage;
    try {
      await signIn(page, url, engram.tenant.reader);
      await page.goto(`${url}/inspector/users/${endUserId}`);
      await page.getByTestId("fact").first().waitFor();
      expect(await page.getByRole("button", { name: "Edit" }).count()).toBe(0);
      expect(await page.getByRole("button", { name: /Forget everything/ }).count()).toBe(0);
      expect(await page.getByText("Read-only key").count()).toBe(1);
    } finally {
      await readerPage.close();
      page = writerPage;
    }
    // The sign-in is shared by the origin's tabs: this one followed the reader's; sign back in as the writer.
    await signIn(page, url, engram.tenant.writer);
  });

  it("forgets everything about a user after a confirmation, and the facts are gone", async () => {
    await page.goto(`${url}/inspector/users/${endUserId}`);
    await page.getByTestId("fact").first().waitFor();
    await page.getByRole("button", { name: "Forget everything…" }).click();
    const confirm = page.getByRole("button", { name: "Forget ada" });
    expect(await confirm.isDisabled()).toBe(true);
    await page.getByLabel("Confirm the user's id").fill("ada");
    await confirm.click();
    await page.getByText("Nothing is known about this user.").waitFor();
    expect(await page.getByRole("status").filter({ hasText: /^Forgot 2 facts, .*recall snippets/ }).count()).toBe(1);
    expect((await engram.gql(FACTS, { id: endUserId })).data.facts).toEqual([]);
  });

  it("searches entries and browses events, and shows costs and jobs", async () => {
    await engram.gql(
      `mutation { appendEvent(input: { scope: ENTITY, scopeRef: "acme", kind: "decision", body: "Moved the **ROAS** target to 4.", source: "crm", sourceRef: "d-1" }) { id } }`,
      {},
      engram.tenant.writer,
    );
    await engram.gql(
      `mutation { createEntry(input: { scope: ENTITY, scopeRef: "acme", title: "ROAS target", summary: "The ROAS target is 4 since May.", tags: ["ads"], importance: 4 }) { id } }`,
      {},
      engram.tenant.writer,
    );
    await page.getByRole("link", { name: "Entries & events" }).click();
    await page.getByLabel("Text").fill("ROAS");
    await page.getByRole("button", { name: "Search" }).click();
    await page.locator(".card", { hasText: "ROAS target" }).waitFor();
    await page.getByRole("cell", { name: "not compressed" }).first().waitFor();
    await shot("entries-and-events");

    await page.getByRole("link", { name: "Costs & jobs" }).click();
    await page.getByRole("img", { name: "Tokens per day by purpose" }).waitFor();
    await page.getByRole("cell", { name: "memory:gpt-4o-mini" }).first().waitFor();
    await shot("costs");
  });

  it("shows that it is reconnecting while the server is down, and carries on by itself when it is back", async () => {
    await page.getByRole("link", { name: "Live feed" }).click();
    await expect.poll(() => page.getByTestId("live-status").textContent()).toBe("Live");
    const port = Number(new URL(url).port);
    const first = engram.app;
    await first.stop();
    // engram.stop() would stop it again; the restarted app is stopped in afterAll instead.
    first.stop = async () => {};
    await expect.poll(() => page.getByTestId("live-status").textContent(), { timeout: 15_000 }).toBe("Reconnecting…");
    await shot("reconnecting");

    restarted = buildApp(engram.services);
    await restarted.start(port, "127.0.0.1");
    await expect.poll(() => page.getByTestId("live-status").textContent(), { timeout: 15_000 }).toBe("Live");
    await say(engram, { user: "bea", conversation: "after-restart", agent: "concierge" }, "Hello after the restart.", "Hi Bea.", engram.tenant.writer);
    await page.locator('[data-kind="turn"]', { hasText: "Hello after the restart." }).waitFor({ timeout: 15_000 });
  });
});
