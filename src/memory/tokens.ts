import { createRequire } from "node:module";

type Counter = (text: string) => number;

// o200k_base: the tokenizer of the current OpenAI chat models. gpt-tokenizer's, not js-tiktoken's:
// the same counts, measured at half the memory (~65 MB against ~150 MB), a quarter of the load
// time and about 15× faster per count, on the paths that count every block (context, metering).
// Loaded on the first count (its CommonJS build, left outside the server's bundle): a server that
// only records turns and recalls never pays for its 2.4 MB of ranks and the tables built from them.
let counter: Counter | undefined;

export function countTokens(text: string): number {
  counter ??= (createRequire(import.meta.url)("gpt-tokenizer/encoding/o200k_base") as { countTokens: Counter }).countTokens;
  return counter(text);
}
