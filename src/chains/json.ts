import { OutputParserException } from "@langchain/core/output_parsers";
import type { z } from "zod";

/** The first balanced JSON object or array in a text, ignoring braces inside strings. */
function firstJsonValue(text: string): string | null {
  const start = text.search(/[[{]/);
  if (start < 0) return null;
  const stack: string[] = [];
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const char = text[i];
    if (inString) {
      if (char === "\\") i++;
      else if (char === '"') inString = false;
    } else if (char === '"') inString = true;
    else if (char === "{" || char === "[") stack.push(char === "{" ? "}" : "]");
    else if (char === "}" || char === "]") {
      if (stack.pop() !== char) return null;
      if (stack.length === 0) return text.slice(start, i + 1);
    }
  }
  return null;
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
  for (const candidate of candidates) {
    const json = firstJsonValue(candidate);
    if (!json) continue;
    let value: unknown;
    try {
      value = JSON.parse(json);
    } catch {
      continue;
    }
    const parsed = schema.safeParse(value);
    if (parsed.success) return parsed.data;
    throw new OutputParserException(
      `The model's JSON has the wrong shape: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
      text,
    );
  }
  throw new OutputParserException("The model's answer holds no JSON.", text);
}
