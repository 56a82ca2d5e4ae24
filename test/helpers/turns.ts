import { RecordTurnDocument, type RecordTurnInput, type RecordTurnMutation } from "../../src/gql/graphql.ts";
import type { TestEngram } from "./engram.ts";

export type RecordedTurn = RecordTurnMutation["recordTurn"];
export type TurnInput = Partial<RecordTurnInput> & Pick<RecordTurnInput, "userMessage">;

let turns = 0;

/**
 * Records one turn as an agent would: the typed RecordTurn operation of
 * schema/operations/conversations.graphql through the API. Fields left out default to agent
 * "agent", end user "user", conversation "conversation" and a clientTurnId unique in the file.
 * Throws on GraphQL errors; a test about those errors calls engram.gql(RecordTurnDocument, …).
 */
export async function recordTurn(engram: Pick<TestEngram, "gql">, input: TurnInput, key?: string | null): Promise<RecordedTurn> {
  const { data, errors } = await engram.gql(
    RecordTurnDocument,
    {
      input: {
        agentExternalId: "agent",
        endUserExternalId: "user",
        conversationExternalId: "conversation",
        clientTurnId: `turn-${++turns}`,
        ...input,
      },
    },
    key ?? undefined,
  );
  if (errors) throw new Error(`recordTurn failed: ${JSON.stringify(errors)}`);
  return data.recordTurn;
}
