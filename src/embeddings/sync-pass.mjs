// A faster pass through the offline encoder's graph (Universal Sentence Encoder lite, TF.js).
// Plain JS: the encoder's worker (encoder-worker.mjs) loads it under tsx, vitest and node.
import * as tf from "@energetic-ai/core";

// The model's graph has two dynamic ops (`Where`), so TF.js runs all of it through
// `executeAsync`, which schedules each of its ~250 kernels through promises. Both `Where`s only
// list positions that follow from the token ids: the tokens within the encoder's 128-token limit,
// and where each of them sits in its sentence. Computed here and fed to the ops that read them,
// the graph runs through the synchronous `execute`. Same vectors to the last bit (checked at load,
// and by test/offline-encoder.test.ts); one short sentence 10.4 -> 8.0 ms, a 58-word text 33.0 -> 27.9
// ms, a batch of 20 unchanged (bench/README.md, "Recall latency: goal and what remains"). If the
// check fails (another version of the model), the library's own path stays.
const CLIP = "module_apply_default/Encoder_en/KonaTransformer/ClipToMaxLength";
const LAYERS = "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack";
const KEPT_ROWS = `${CLIP}/Reshape`;
const POSITIONS = `${LAYERS}/Layer_0/AddTimingSignal/strided_slice_2`;
const CELLS = `${LAYERS}/Layer_1/TransformerLayer/FFN/StoreMask/ToInt32`;
// Over the 128-token limit in the middle, so the rows after a clipped text are checked too.
const PROBE = ["Did I tell you about my trip to Paris last May?", "word ".repeat(140), "ok", "Ünïcödé çafé 日本語 🙂"];

/**
 * The encoder with `embed` through the synchronous pass when it gives the library's vectors
 * exactly (`sync: true`), or through the library's own (`sync: false`, and the `reason`).
 */
export async function withSyncPass(encoder) {
  let reason;
  try {
    const limit = encoder.model.executor.weightMap[`${CLIP}/Less/y`][0].dataSync()[0];
    const embed = (texts) => embedSync(encoder, limit, texts);
    const expected = await encoder.embed(PROBE);
    const got = embed(PROBE);
    const same = got.length === expected.length &&
      got.every((vector, i) => vector.length === expected[i].length && vector.every((x, j) => x === expected[i][j]));
    if (same) return { embed, sync: true };
    reason = "its vectors differ from the library's";
  } catch (error) {
    reason = String(error?.message ?? error);
  }
  return { embed: (texts) => encoder.embed(texts), sync: false, reason };
}

function embedSync(encoder, limit, texts) {
  const ids = texts.map((text) => encoder.tokenizer.encode(text));
  const indices = [];
  const values = [];
  const kept = [];
  const cells = [];
  let row = 0;
  ids.forEach((sentence, s) =>
    sentence.forEach((id, position) => {
      indices.push(s, position);
      values.push(id);
      if (position < limit) {
        kept.push(row);
        cells.push(s, position);
      }
      row++;
    }),
  );
  return tf.tidy(() => {
    const output = encoder.model.execute({
      indices: tf.tensor2d(indices, [indices.length / 2, 2], "int32"),
      values: tf.tensor1d(values, "int32"),
      [KEPT_ROWS]: tf.tensor1d(kept, "int32"),
      [POSITIONS]: tf.tensor1d(cells.filter((_, i) => i % 2 === 1), "int32"),
      [CELLS]: tf.tensor2d(cells, [cells.length / 2, 2], "int32"),
    });
    // A text with no tokens has no row, so the output would be short (the library's too): refuse.
    if (output.shape[0] !== texts.length) throw new Error(`${texts.length} texts gave ${output.shape[0]} vectors`);
    const data = output.dataSync();
    const width = output.shape[1];
    return texts.map((_, i) => Array.from(data.subarray(i * width, (i + 1) * width)));
  });
}
