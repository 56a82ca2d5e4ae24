import type { BaseLanguageModelInput } from "@langchain/core/language_models/base";
import type { BaseMessage } from "@langchain/core/messages";
import { OutputParserException } from "@langchain/core/output_parsers";
import { RunnableLambda, type Runnable } from "@langchain/core/runnables";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { expect, it } from "vitest";
import type { ChatModel } from "../../src/models/metered.ts";

/** A FakeListChatModel behind a lambda that records the messages each call sends it. */
export function scriptedModel(responses: string[]) {
  const fake = new FakeListChatModel({ responses });
  const seen: BaseMessage[][] = [];
  const model: ChatModel = RunnableLambda.from(async (prompt: BaseLanguageModelInput) => {
    const messages = (prompt as { toChatMessages(): BaseMessage[] }).toChatMessages();
    seen.push(messages);
    return fake.invoke(messages);
  });
  return { model, seen };
}

/** Awaits the promise and returns what it threw, or fails when it resolved. */
export async function thrown(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => {
      throw new Error(`expected a throw, got ${JSON.stringify(value)}`);
    },
    (error: unknown) => error,
  );
}

/** Expects the promise to reject with an output-parsing failure that carries the model's answer. */
export async function expectBroken(promise: Promise<unknown>, answer: string) {
  const error = await thrown(promise);
  expect(error, answer).toBeInstanceOf(OutputParserException);
  expect((error as OutputParserException).llmOutput, answer).toBe(answer);
}

/** The prompt a chain sends for an input, as "[system]\n…\n\n[human]\n…", for an inline snapshot. */
export async function renderedPrompt<I>(build: (model: ChatModel) => Runnable<I, unknown>, input: I): Promise<string> {
  const { model, seen } = scriptedModel(["{}"]);
  await build(model).invoke(input).catch(() => {}); // only the prompt matters here, not the answer
  return seen[0].map((m) => `[${m.getType()}]\n${m.content}`).join("\n\n");
}

/**
 * One row of a chain's answer table. Every chain is read against the same four kinds: a good
 * answer, one in ```json fences, one wrapped in prose, and broken ones (no JSON, cut off, wrong
 * shape), which must throw OutputParserException carrying the model's answer.
 */
export type AnswerCase<O> =
  | { kind: "good" | "fenced" | "prose"; what: string; answer: string; expected: O }
  | { kind: "broken"; what: string; answer: string };

/** One test per row: the chain built on a model that gives that answer, invoked on `input`. */
export function itReadsAnswers<I, O>(build: (model: ChatModel) => Runnable<I, O>, input: I, cases: AnswerCase<O>[]) {
  for (const kind of ["good", "fenced", "prose", "broken"] as const) {
    if (!cases.some((c) => c.kind === kind)) throw new Error(`the answer table has no ${kind} answer`);
  }
  it.each(cases)("reads a $kind answer: $what", async (row) => {
    const { model } = scriptedModel([row.answer]);
    const answer = build(model).invoke(input);
    if (row.kind === "broken") await expectBroken(answer, row.answer);
    else expect(await answer).toEqual(row.expected);
  });
}
