import { bagOfWords } from "./fake-embeddings.ts";
import type { ModelServer } from "./model-server.ts";
import { factsScript, memoryScript } from "./scripted-memory-model.ts";

/** How the scripted chat model behaves: well, down (503), hanging (never answers) or answering garbage. */
export type ModelFault = "none" | "down" | "hanging" | "garbage";

/**
 * Scripts `model` as a memory model that can be put into a fault and out again. When well, the
 * gate finds every message worth remembering, so each turn is extracted; embeddings always answer
 * (the fault is the chat model's). Returns the switch.
 */
export function scriptFaultyModel(model: ModelServer): { set(fault: ModelFault): void; readonly fault: ModelFault } {
  let fault: ModelFault = "none";
  const well = factsScript({ triage: () => ({ remember: true }) }, memoryScript());
  model.embed((input) => input.map((text) => bagOfWords(text)));
  model.respond((request) => {
    if (fault === "down") return { status: 503, message: "the model is down" };
    if (fault === "hanging") return new Promise(() => {}); // the client's timeout ends it
    if (fault === "garbage") return "<html>I am a teapot, not JSON</html>";
    return well(request);
  });
  return {
    set(next) {
      fault = next;
    },
    get fault() {
      return fault;
    },
  };
}
