/**
 * Deterministic embeddings for tests: a hashed bag of word stems, normalised. Texts sharing
 * words are close, texts sharing none are orthogonal, so tests can predict what recall finds.
 */
export function bagOfWords(text: string, dimensions = 256): number[] {
  const vector = new Array<number>(dimensions).fill(0);
  for (const word of text.toLowerCase().match(/[a-z0-9]+/g) ?? []) {
    if (word.length < 3 || STOP.has(word)) continue;
    const stem = word.replace(/(ing|ed|es|s)$/, "");
    let hash = 2166136261;
    for (const char of stem) hash = Math.imul(hash ^ char.charCodeAt(0), 16777619);
    vector[Math.abs(hash) % dimensions] += 1;
  }
  vector[0] += 0.01; // never the zero vector, which has no cosine
  const norm = Math.hypot(...vector);
  return vector.map((v) => v / norm);
}

const STOP = new Set(["the", "and", "for", "you", "your", "with", "that", "this", "what", "was", "are", "did", "can", "have", "user", "assistant"]);
