import type { Readable } from "node:stream";

/**
 * glibc's malloc gives threads that allocate at the same time arenas of their own (up to eight per
 * core) and keeps what each arena has freed for it. Chroma's Rust runtime, libuv's pool and V8's
 * helper threads all allocate, so each process grows arenas it seldom returns. Two arenas per
 * process cut the server tree's peak in an all-conversations peers-harness run of Engram alone
 * from 605 to 571 MB (574 -> 547 in a 4-conversation one), with recall within what two runs of
 * one build differ by (bench/README.md, "Memory footprint"). `npm start` and the Docker image
 * set it for the server; a value the operator set (not empty) is kept.
 */
export const MALLOC_ARENAS = "2";

/** The environment the embedded store's child processes start with. */
export function childEnv(): NodeJS.ProcessEnv {
  return { ...process.env, MALLOC_ARENA_MAX: process.env.MALLOC_ARENA_MAX || MALLOC_ARENAS };
}

/** The last 4,000 characters a child wrote on these streams, for a failed start's message. */
export function recentOutput(...streams: (Readable | null)[]): () => string {
  let output = "";
  for (const stream of streams) {
    stream?.setEncoding("utf8").on("data", (text: string) => {
      output = (output + text).slice(-4_000);
    });
  }
  return () => output;
}
