import { OutputParserException, StringOutputParser } from "@langchain/core/output_parsers";
import type { ChatPromptTemplate } from "@langchain/core/prompts";
import { RunnableLambda, type Runnable } from "@langchain/core/runnables";
import { z } from "zod";
import type { ChatModel } from "../models/metered.ts";

/** A boolean, also when a model writes it as "true" / "false". */
export const modelBoolean = z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]);

/** An integer, also when written as a string of digits; null, booleans and "" are broken answers. */
export const modelInteger = z
  .union([z.number(), z.string().regex(/^\d+$/).transform(Number)])
  .pipe(z.number().int());

/**
 * Where the balanced JSON-looking span starting at `start` ends (its closing bracket), ignoring
 * brackets inside strings; -1 when it is not balanced before `end`. `scanned`: how far it read.
 */
function balancedFrom(text: string, start: number, end: number): { close: number; scanned: number } {
  const stack: string[] = [];
  let inString = false;
  let i = start;
  for (; i < end; i++) {
    const char = text[i];
    if (inString) {
      if (char === "\\") i++;
      else if (char === '"') inString = false;
    } else if (char === '"') inString = true;
    else if (char === "{" || char === "[") stack.push(char === "{" ? "}" : "]");
    else if (char === "}" || char === "]") {
      if (stack.pop() !== char) return { close: -1, scanned: i - start + 1 };
      if (stack.length === 0) return { close: i, scanned: i - start + 1 };
    }
  }
  return { close: -1, scanned: i - start };
}

/**
 * How many times over its length reading an answer may scan it. Each bracket starts a try that
 * can run to the end, so an answer of thousands of unclosed braces (a model in a loop, or a
 * hostile endpoint) took time growing with its length squared, on the event loop that answers
 * every request; past this many passes the rest is not tried.
 */
const SCAN_PASSES = 8;

/** Every parseable JSON object or array in a text, in order (prose may hold stray brackets). */
function* jsonValues(text: string): Generator<unknown> {
  let budget = SCAN_PASSES * text.length;
  const opener = /[[{]/g;
  for (let found = opener.exec(text); found && budget > 0; found = opener.exec(text)) {
    const start = found.index;
    const { close, scanned } = balancedFrom(text, start, Math.min(text.length, start + budget));
    budget -= scanned;
    if (close >= 0) {
      try {
        yield JSON.parse(text.slice(start, close + 1));
      } catch {
        // not JSON after all: look further on
      }
    }
    opener.lastIndex = start + 1;
  }
}

/**
 * Reads a model's JSON answer even when wrapped in prose or code fences, and checks its shape.
 * A broken answer throws LangChain's OutputParserException (code OUTPUT_PARSING_FAILURE).
 */
export function parseJsonAnswer<T>(text: string, schema: z.ZodType<T>): T {
  const candidates = [
    ...[...text.matchAll(/```(?:json)?\s*([\s\S]*?)```/g)].map((m) => m[1]),
    text,
  ];
  let shapeError: string | undefined;
  for (const candidate of candidates) {
    for (const value of jsonValues(candidate)) {
      const parsed = schema.safeParse(value);
      if (parsed.success) return parsed.data;
      shapeError ??= parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ");
    }
  }
  throw new OutputParserException(
    shapeError ? `The model's JSON has the wrong shape: ${shapeError}` : "The model's answer holds no JSON.",
    text,
  );
}

/**
 * The shape every Engram chain has: typed input rendered into the prompt's variables, the
 * model, and a JSON answer read with parseJsonAnswer (a broken one throws
 * OutputParserException), optionally mapped with the input (to drop what was not asked about).
 * The chain's name (its runName, usage label and routing key) comes from registry.ts.
 */
export function jsonAnswerChain<I, A, O = A>(options: {
  prompt: ChatPromptTemplate;
  model: ChatModel;
  variables: (input: I) => Record<string, string>;
  answer: z.ZodType<A>;
  result?: (answer: A, input: I) => O;
}): Runnable<I, O> {
  const ask = options.prompt.pipe(options.model).pipe(new StringOutputParser());
  return RunnableLambda.from(async (input: I, config) => {
    const answer = parseJsonAnswer(await ask.invoke(options.variables(input), config), options.answer);
    return options.result ? options.result(answer, input) : (answer as unknown as O);
  });
}

/**
 * What a warning may say of an answer that could not be read: its length, not its text (the model
 * repeats what users said, and logs outlive a forget), nor the parser's message about it.
 */
export function unreadable(error: OutputParserException): { answerChars: number } {
  return { answerChars: String(error.llmOutput ?? "").length };
}
