import { builder } from "../builder.ts";
import { gateInstructions } from "../memory/gate/gate.ts";

const GateInstructionsRef = builder.objectRef<ReturnType<typeof gateInstructions>>("GateInstructions").implement({
  description:
    "What an agent runtime adds to its own model call so Engram's gate rides on it: append the prompt, ask for " +
    "the verdict as structured output or a tool call with this schema, and pass it as `gate` to context or recordTurn.",
  fields: (t) => ({
    prompt: t.exposeString("prompt", { description: "The instructions to append to your system prompt." }),
    jsonSchema: t.field({
      type: "JSON",
      description: "JSON Schema (draft-07, without $schema, to nest in your own) of the verdict: remember, forget, forgetTargets, needsRecall.",
      resolve: (i) => i.jsonSchema,
    }),
    toolName: t.exposeString("toolName", { description: "A name for the verdict's tool or response format." }),
  }),
});

builder.queryFields((t) => ({
  gateInstructions: t.field({
    type: GateInstructionsRef,
    authScopes: { reader: true },
    resolve: () => gateInstructions(),
  }),
}));
