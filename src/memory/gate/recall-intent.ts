import type { Embeddings } from "@langchain/core/embeddings";
import type { EmbeddingsProvider } from "../../embeddings/index.ts";
import { OFFLINE_MODEL } from "../../embeddings/offline.ts";
import { needsRecallByKeywords } from "./keywords.ts";

/**
 * Sentences that ask for earlier conversations, in the ways users phrase it. A message close
 * enough to one of them needs recall even when no keyword of keywords.ts matches ("what's my
 * dog called?"). Written apart from the labelled set the threshold was chosen on
 * (bench/recall-gate), so the measurement is not a test on the training data.
 */
export const RECALL_PROTOTYPES = [
  "Same as last time, please.",
  "Can you reorder what I got before?",
  "What did we talk about in our previous conversation?",
  "Remind me what you recommended to me earlier.",
  "Do you remember what I told you about my family?",
  "Book the usual for me.",
  "Like we discussed the other day.",
  "What was the name of that place I mentioned before?",
  "Let's continue where we left off.",
  "Did I already tell you about my trip?",
  "What do you know about me?",
  "Which one did I pick last week?",
  "Go with my regular order.",
  "Use the same settings as before.",
  "You suggested something for this a while ago, what was it?",
  "What's my dog's name again?",
  "How is my project going since we last spoke?",
  "When is my appointment?",
] as const;

/**
 * Cosine similarity to the nearest prototype at or above which a message needs recall, per
 * embedder. Chosen on bench/recall-gate's labelled set for the offline encoder (bench/README.md);
 * other embedders have no measured threshold, and there the keywords decide alone.
 */
export const RECALL_INTENT_THRESHOLD: Record<string, number> = { [OFFLINE_MODEL]: 0.375 };

const prototypes = new Map<string, Promise<number[][]>>();

/** The prototypes' vectors for one embedder: embedded once per process and model, then cached. */
export function prototypeVectors(embeddings: Embeddings, model: string): Promise<number[][]> {
  let vectors = prototypes.get(model);
  if (!vectors) {
    vectors = embeddings.embedDocuments([...RECALL_PROTOTYPES]);
    vectors.catch(() => prototypes.delete(model));
    prototypes.set(model, vectors);
  }
  return vectors;
}

function cosine(a: number[], b: number[]) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return na && nb ? dot / Math.sqrt(na * nb) : 0;
}

/** The similarity of a message's vector to its nearest recall prototype. */
export async function recallIntentSimilarity(embeddings: Embeddings, model: string, vector: number[]) {
  const vectors = await prototypeVectors(embeddings, model);
  return Math.max(...vectors.map((p) => cosine(p, vector)));
}

export type LocalRecallDecision = {
  needsRecall: boolean;
  /** The message's embedding, when it was computed: the recall search reuses it. */
  vector: number[] | null;
  decidedBy: "KEYWORDS" | "EMBEDDING" | "NONE";
};

/**
 * Whether a message needs earlier conversations, decided before the reply without a chat model:
 * the keyword patterns, else the message's similarity to the recall prototypes. It embeds the
 * message at most once; when recall is needed that vector is the one the search uses.
 */
export async function decideRecallLocally(
  deps: { embeddings: EmbeddingsProvider },
  tenantId: string,
  message: string,
): Promise<LocalRecallDecision> {
  const byKeywords = needsRecallByKeywords(message);
  const { embeddings, model } = await deps.embeddings.forTenant(tenantId);
  const threshold = RECALL_INTENT_THRESHOLD[model];
  if (byKeywords || threshold === undefined) {
    return { needsRecall: byKeywords, vector: null, decidedBy: byKeywords ? "KEYWORDS" : "NONE" };
  }
  const vector = await embeddings.embedQuery(message);
  const needsRecall = (await recallIntentSimilarity(embeddings, model, vector)) >= threshold;
  return { needsRecall, vector: needsRecall ? vector : null, decidedBy: needsRecall ? "EMBEDDING" : "NONE" };
}
