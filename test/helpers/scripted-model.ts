import type { BaseLanguageModelInput } from "@langchain/core/language_models/base";
import type { BaseMessage } from "@langchain/core/messages";
import { RunnableLambda } from "@langchain/core/runnables";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import type { ChatModel } from "../../src/models/index.ts";

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
