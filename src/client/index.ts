import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { print } from "graphql";
import { createClient, type Client } from "graphql-ws";
import {
  AddFactDocument,
  AppendEventDocument,
  ContextDocument,
  ConversationByExternalIdDocument,
  ConversationSummaryDocument,
  CorrectEntryDocument,
  CorrectFactDocument,
  CreateEntryDocument,
  DeleteConversationDocument,
  DeleteFactDocument,
  EndUserByExternalIdDocument,
  EntriesDocument,
  EntryChangedDocument,
  EventAppendedDocument,
  EventsDocument,
  FactChangedDocument,
  GateInstructionsDocument,
  FactsDocument,
  ForgetEntryDocument,
  ForgetUserDocument,
  ViewerDocument,
  MemoryFeedDocument,
  MemoryRecallDocument,
  RecallDocument,
  RecallIndexStatusDocument,
  RecordTurnDocument,
  SummaryChangedDocument,
  TurnRecordedDocument,
  UpsertEndUserDocument,
  type AddFactInput,
  type AppendEventInput,
  type ContextInput,
  type CorrectEntryInput,
  type CorrectFactInput,
  type CreateEntryInput,
  type EntriesQueryVariables,
  type EventsQueryVariables,
  type RecallInput,
  type RecordTurnInput,
  type UpsertEndUserInput,
} from "../gql/graphql.ts";
import { EngramError, Transport, graphqlUrl, type CallOptions, type GraphQLErrorShape, type TransportOptions } from "./transport.ts";

export { EngramError, type CallOptions, type GraphQLErrorShape } from "./transport.ts";
export type * from "../gql/graphql.ts";

export type EngramClientOptions = TransportOptions & {
  /** A WebSocket class for subscriptions; default the global one (browsers, Node 22+), else `ws`. */
  webSocketImpl?: unknown;
};

/** What `subscribe(topic, variables)` can follow: each topic is a subscription operation. */
const TOPICS = {
  eventAppended: EventAppendedDocument,
  entryChanged: EntryChangedDocument,
  factChanged: FactChangedDocument,
  summaryChanged: SummaryChangedDocument,
  turnRecorded: TurnRecordedDocument,
  memoryRecall: MemoryRecallDocument,
  memoryFeed: MemoryFeedDocument,
};
type Topics = typeof TOPICS;
export type Topic = keyof Topics;
type DataOf<D> = D extends TypedDocumentNode<infer T, any> ? T : never;
type VariablesOf<D> = D extends TypedDocumentNode<any, infer V> ? V : never;
export type TopicVariables<K extends Topic> = VariablesOf<Topics[K]>;
/** One item of a topic: the subscription field's value. */
export type TopicItem<K extends Topic> = DataOf<Topics[K]>[K & keyof DataOf<Topics[K]>];

/** A fresh id for a write the caller gave none for, so retries of it are no-ops on the server. */
const newId = () => globalThis.crypto.randomUUID();

type Optional<T, K extends keyof T> = Omit<T, K> & Partial<Pick<T, K>>;

/** An end user by Engram's id, or by your own as recordTurn takes it: `{ externalId: "alice" }`. */
export type EndUserRef = string | { externalId: string };

const endUserVariables = (endUser: EndUserRef) =>
  typeof endUser === "string" ? { endUserId: endUser } : { endUserExternalId: endUser.externalId };

/**
 * Your model's verdict on the user's message, in the shape gateInstructions' jsonSchema gives
 * it. Passed as `gate` to context or recordTurn, it replaces Engram's own gate call.
 */
export type GateVerdict = {
  remember: boolean;
  forget: "NONE" | "SOME" | "ALL";
  forgetTargets?: string[];
  needsRecall: boolean;
};

/** What gateInstructions returns: append `prompt` to your system prompt, ask for `jsonSchema`. */
export type GateInstructions = { prompt: string; jsonSchema: Record<string, unknown>; toolName: string };

/**
 * Engram over HTTP (and WebSocket for subscriptions). Methods are named as the product names
 * them; each returns the operation's typed result and throws an EngramError with the server's
 * code. Reads and idempotent writes are retried on network errors, timeouts and 5xx.
 */
export class EngramClient {
  private readonly transport: Transport;
  private ws?: Promise<Client>;
  private gate?: Promise<GateInstructions>;

  constructor(private readonly options: EngramClientOptions) {
    this.transport = new Transport(options);
  }

  private query<T, V>(document: TypedDocumentNode<T, V>, variables: V, call?: CallOptions) {
    return this.transport.request(document, variables, true, call);
  }

  private mutate<T, V>(document: TypedDocumentNode<T, V>, variables: V, idempotent: boolean, call?: CallOptions) {
    return this.transport.request(document, variables, idempotent, call);
  }

  /** Who the key is: its tenant and role. */
  async viewer(call?: CallOptions) {
    return (await this.query(ViewerDocument, {}, call)).viewer;
  }

  // Event log and curated entries.

  /** Appends an event; without a sourceRef the client makes one, so a retry appends nothing twice. */
  async appendEvent(input: Optional<AppendEventInput, "sourceRef">, call?: CallOptions) {
    const variables = { input: { ...input, sourceRef: input.sourceRef ?? newId() } };
    return (await this.mutate(AppendEventDocument, variables, true, call)).appendEvent;
  }

  /** Lists events newest first. */
  async events(filter: EventsQueryVariables = {}, call?: CallOptions) {
    const { events } = await this.query(EventsDocument, filter, call);
    return { events: events.edges.map((edge) => edge.node), ...events.pageInfo };
  }

  /** Not retried: a lost answer followed by a retry would create the entry twice. */
  async createEntry(input: CreateEntryInput, call?: CallOptions) {
    return (await this.mutate(CreateEntryDocument, { input }, false, call)).createEntry;
  }

  /** Entries by scope, scopeRef, tags and text (ranked when `search` is given), one page. */
  async searchEntries(filter: EntriesQueryVariables = {}, call?: CallOptions) {
    const { entries } = await this.query(EntriesDocument, filter, call);
    return { entries: entries.edges.map((edge) => edge.node), ...entries.pageInfo };
  }

  async correctEntry(id: string, input: CorrectEntryInput, call?: CallOptions) {
    return (await this.mutate(CorrectEntryDocument, { id, input }, true, call)).correctEntry;
  }

  /** Not retried: a retry after a lost answer would report NOT_FOUND for a forget that worked. */
  async forgetEntry(id: string, call?: CallOptions) {
    return (await this.mutate(ForgetEntryDocument, { id }, false, call)).forgetEntry;
  }

  // Conversations.

  /** Records a turn; without a clientTurnId the client makes one, so a retry records nothing twice. */
  async recordTurn(input: Optional<Omit<RecordTurnInput, "gate">, "clientTurnId"> & { gate?: GateVerdict | null }, call?: CallOptions) {
    const variables = { input: { ...input, clientTurnId: input.clientTurnId ?? newId() } };
    return (await this.mutate(RecordTurnDocument, variables, true, call)).recordTurn;
  }

  /**
   * Prompt material for the next model call: blocks ready to put in the prompt, with their
   * tokens. The conversation by `conversationId`, or by your own three ids as recordTurn takes them.
   */
  async context(input: Omit<ContextInput, "gate"> & { gate?: GateVerdict | null }, call?: CallOptions) {
    return (await this.query(ContextDocument, { input }, call)).context;
  }

  /**
   * The prompt fragment and the JSON schema of Engram's gate verdict, for your own model call
   * (structured output or a tool); hand the verdict to recordTurn as `gate`. Cached per client.
   */
  async gateInstructions(call?: CallOptions): Promise<GateInstructions> {
    this.gate ??= this.query(GateInstructionsDocument, {}, call).then(
      ({ gateInstructions }) => gateInstructions as GateInstructions,
    );
    this.gate.catch(() => (this.gate = undefined));
    return this.gate;
  }

  /**
   * The conversation recorded under your own id, with its last messages (default 20, at most
   * 500); null before its first turn.
   */
  async conversation(externalId: string, options: { lastMessages?: number } & CallOptions = {}) {
    const { lastMessages = 20, ...call } = options;
    return (await this.query(ConversationByExternalIdDocument, { externalId, lastMessages }, call)).conversationByExternalId;
  }

  /** Deletes a conversation with its messages, summaries and recall data. Not retried. */
  async deleteConversation(conversationId: string, call?: CallOptions) {
    return (await this.mutate(DeleteConversationDocument, { id: conversationId }, false, call)).deleteConversation;
  }

  /** A conversation's rolling summary (null until the first rewrite). */
  async conversationSummary(conversationId: string, call?: CallOptions) {
    return (await this.query(ConversationSummaryDocument, { id: conversationId }, call)).conversation;
  }

  // End users.

  /** The end user known by your own id, or null before Engram has seen them. */
  async endUser(externalId: string, call?: CallOptions) {
    return (await this.query(EndUserByExternalIdDocument, { externalId }, call)).endUserByExternalId;
  }

  /** Creates the end user (or renames them) by your own id. */
  async upsertEndUser(input: UpsertEndUserInput, call?: CallOptions) {
    return (await this.mutate(UpsertEndUserDocument, { input }, true, call)).upsertEndUser;
  }

  // User facts.

  /** The user's facts, core first; the user by Engram's id or `{ externalId }`, your own. */
  async facts(endUser: EndUserRef, call?: CallOptions) {
    return (await this.query(FactsDocument, endUserVariables(endUser), call)).facts;
  }

  /** Not retried: a retry after a lost answer could add the fact twice. */
  async addFact(input: AddFactInput, call?: CallOptions) {
    return (await this.mutate(AddFactDocument, { input }, false, call)).addFact;
  }

  async correctFact(id: string, input: CorrectFactInput, call?: CallOptions) {
    return (await this.mutate(CorrectFactDocument, { id, input }, true, call)).correctFact;
  }

  /** Not retried, as forgetEntry. */
  async deleteFact(id: string, call?: CallOptions) {
    return (await this.mutate(DeleteFactDocument, { id }, false, call)).deleteFact;
  }

  /**
   * Forgets everything about a user (facts, recall snippets and vectors); a receipt of counts.
   * Not retried: a retry after a lost answer would forget nothing more and return a receipt of
   * zeros, and audit a second forget; `forgetRecords` lists what was done.
   */
  async forgetUser(endUser: EndUserRef, call?: CallOptions) {
    return (await this.mutate(ForgetUserDocument, endUserVariables(endUser), false, call)).forgetUser;
  }

  // Recall.

  /** Ranked snippets of the user's earlier conversations for a text (no gate, no judge). */
  async recall(input: RecallInput, call?: CallOptions) {
    return (await this.query(RecallDocument, { input }, call)).recall;
  }

  /** How much of the user's history is not searchable yet (pending 0: all of it is). */
  async recallIndexStatus(endUser: EndUserRef, call?: CallOptions) {
    return (await this.query(RecallIndexStatusDocument, endUserVariables(endUser), call)).recallIndexStatus;
  }

  // Subscriptions.

  /**
   * Follows a topic over graphql-ws: `for await (const event of client.subscribe("eventAppended", { scopeRef }))`.
   * Ends when the signal aborts or the loop breaks; a refused key or bad variables throw an EngramError,
   * and so does a subscription that fell too far behind (SUBSCRIBER_TOO_SLOW: subscribe again).
   */
  async *subscribe<K extends Topic>(topic: K, variables: TopicVariables<K>, call: { signal?: AbortSignal } = {}): AsyncGenerator<TopicItem<K>> {
    const client = await this.webSocketClient();
    const iterator = client.iterate<DataOf<Topics[K]>>({ query: print(TOPICS[topic]), variables: variables as Record<string, unknown> });
    const onAbort = () => void iterator.return?.();
    call.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      while (!call.signal?.aborted) {
        let next: IteratorResult<{ data?: DataOf<Topics[K]> | null; errors?: readonly GraphQLErrorShape[] }>;
        try {
          next = await iterator.next();
        } catch (error) {
          throw subscriptionError(error);
        }
        if (next.done) return;
        const { data, errors } = next.value;
        if (errors?.length) throw subscriptionError(errors);
        if (data) yield (data as Record<string, unknown>)[topic] as TopicItem<K>;
      }
    } finally {
      call.signal?.removeEventListener("abort", onAbort);
      await iterator.return?.();
    }
  }

  private webSocketClient(): Promise<Client> {
    this.ws ??= (async () => {
      const webSocketImpl = this.options.webSocketImpl ?? globalThis.WebSocket ?? (await import("ws")).default;
      return createClient({
        url: graphqlUrl(this.options.url).replace(/^http/, "ws"),
        webSocketImpl,
        connectionParams: { authorization: `Bearer ${this.options.apiKey}` },
        lazy: true,
        retryAttempts: this.options.retries ?? 3,
        // A refused key is refused again: fail at once (graphql-ws tries 4403 again by default).
        shouldRetry: (closed) => !(closeCodeOf(closed) in CLOSED_FOR),
      });
    })();
    return this.ws;
  }

  /** Closes the subscription socket, if one was opened. */
  async close(): Promise<void> {
    const ws = this.ws;
    this.ws = undefined;
    if (ws) await (await ws).dispose();
  }
}

/**
 * The server's close codes that are not the network's: a key refused at connect (4403, graphql-ws's
 * Forbidden from onConnect), a key revoked while open (4401), one socket too many for the key
 * (4429). None is cured by connecting again, so none is retried and none is NETWORK_ERROR.
 */
const CLOSED_FOR: Record<number, string> = { 4401: "UNAUTHENTICATED", 4403: "UNAUTHENTICATED", 4429: "TOO_MANY_CONNECTIONS" };

/** A close event's code, or -1 for anything else graphql-ws hands over (an Error, a network event). */
const closeCodeOf = (error: unknown): number => {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "number" ? code : -1;
};

/** A subscription failure as an EngramError: GraphQL errors keep their code; a closed socket says why. */
function subscriptionError(error: unknown): EngramError {
  if (Array.isArray(error) && error.length) {
    const errors = error as GraphQLErrorShape[];
    return new EngramError(errors[0].extensions?.code ?? "INTERNAL_SERVER_ERROR", errors[0].message, { errors });
  }
  const closed = closeCodeOf(error);
  if (closed !== -1) {
    const reason = (error as { reason?: string }).reason ?? "";
    return new EngramError(CLOSED_FOR[closed] ?? "NETWORK_ERROR", `The subscription socket closed (${closed} ${reason}).`.trim(), { cause: error });
  }
  if (error instanceof EngramError) return error;
  return new EngramError("NETWORK_ERROR", `The subscription failed: ${(error as Error)?.message ?? error}`, { cause: error });
}

/** Context blocks as one text for a prompt: each block under its title, empty ones left out. */
export function memoryText(blocks: readonly { title: string; text: string }[]): string {
  return blocks
    .filter((block) => block.text.trim())
    .map((block) => `## ${block.title}\n${block.text}`)
    .join("\n\n");
}

/** `createEngramClient({ url, apiKey })`, the same as `new EngramClient(...)`. */
export const createEngramClient = (options: EngramClientOptions) => new EngramClient(options);
