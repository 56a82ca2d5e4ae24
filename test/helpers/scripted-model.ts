import type { BaseLanguageModelInput } from "@langchain/core/language_models/base";
import type { BaseMessage } from "@langchain/core/messages";
import { OutputParserException } from "@langchain/core/output_parsers";
import { RunnableLambda } from "@langchain/core/runnables";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { expect } from "vitest";
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
