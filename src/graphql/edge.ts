import { getNamedType, GraphQLError, Kind, type ASTVisitor, type DocumentNode, type GraphQLSchema, type TypeNode, type ExecutionResult, type ValidationContext } from "graphql";
import type { Plugin } from "graphql-yoga";
import { getComplexity, simpleEstimator, type ComplexityEstimator } from "graphql-query-complexity";
import { findTextProblem, textProblem } from "../limits.ts";

/**
 * Typed errors for what a request gets wrong before any resolver runs, and text checks at the
 * edge: every such failure answers with an `extensions.code` and its message, and nothing is
 * half-written because nothing runs.
 */

const badInput = (message: string) => new GraphQLError(message, { extensions: { code: "BAD_USER_INPUT" } });

/** Refuses string literals in the document that cannot be stored. */
function safeTextRule(context: ValidationContext): ASTVisitor {
  return {
    StringValue(node) {
      const problem = textProblem(node.value);
      if (problem) context.reportError(new GraphQLError(`A string argument ${problem}.`, { nodes: [node], extensions: { code: "BAD_USER_INPUT" } }));
    },
  };
}

/** Root fields that may call models (the gate, the re-rank judge, embeddings) each time they run. */
const MODEL_FIELDS = new Set(["context", "recall"]);
/** Root fields that tokenize a conversation's recent history each time they run. */
const TIMELINE_FIELDS = new Set(["contextTimeline"]);
// Each gathers up to LIMITS.exportRowsMax rows into the reply.
const EXPORT_FIELDS = new Set(["exportUser"]);

/**
 * A budget per request for root fields that cost much each time they run: aliases could
 * otherwise run `context` 30 times in one request, each spending model calls, or
 * `contextTimeline` 30 times, each tokenizing up to 200 turns on the one event loop.
 */
function rootFieldsRule(fields: ReadonlySet<string>, max: number, message: string) {
  return (context: ValidationContext): ASTVisitor => {
    let count = 0;
    return {
      Field(node) {
        if (context.getParentType()?.name !== "Query" || !fields.has(node.name.value)) return;
        if (++count === max + 1) {
          context.reportError(new GraphQLError(message, { nodes: [node], extensions: { code: "QUERY_TOO_COMPLEX" } }));
        }
      },
    };
  };
}

// graphql-armor's messages: "Query depth limit of …", "Aliases limit of …", "Query Cost limit of …".
const LIMIT_MESSAGE = /(depth|aliases|cost|directives|tokens|model calls) limit of \d+ /i;

/** The code a request-level error (parse, validation, variables) answers with. */
function requestErrorCode(error: GraphQLError): string {
  if (LIMIT_MESSAGE.test(error.message)) return "QUERY_TOO_COMPLEX";
  const code = error.extensions?.code;
  return typeof code === "string" && code !== "GRAPHQL_VALIDATION_FAILED" ? code : "BAD_USER_INPUT";
}

function withCode(error: GraphQLError): GraphQLError {
  const code = requestErrorCode(error);
  if (error.extensions?.code === code) return error;
  return new GraphQLError(error.message, {
    nodes: error.nodes,
    source: error.source,
    positions: error.positions,
    path: error.path,
    // No originalError: error masking would otherwise report the inner error's (absent) code.
    extensions: { ...error.extensions, code },
  });
}

function variablesRefusal(variables: unknown): ExecutionResult | null {
  const problem = findTextProblem(variables ?? {}, "variables");
  return problem ? { errors: [badInput(`Invalid input: ${problem}.`)] } : null;
}

/**
 * One plugin for HTTP and WebSocket (both run yoga's envelop pipeline): text checks on literals
 * and variables, and a code on every validation and variable-coercion error.
 */
export function useTypedRequestErrors(limits: { modelFieldsPerRequest: number; timelinesPerRequest: number; exportsPerRequest: number }): Plugin {
  const { modelFieldsPerRequest: models, timelinesPerRequest: timelines, exportsPerRequest: exports } = limits;
  return {
    onParse() {
      // A syntax error, or an escape that is not Unicode (a lone surrogate such as "\ud800").
      return ({ result, replaceParseResult }) => {
        if (result instanceof GraphQLError) {
          replaceParseResult(
            new GraphQLError(result.message, { source: result.source, positions: result.positions, extensions: { ...result.extensions, code: "BAD_USER_INPUT" } }),
          );
        }
      };
    },
    onValidate({ addValidationRule }) {
      addValidationRule(safeTextRule);
      addValidationRule(
        rootFieldsRule(MODEL_FIELDS, models, `Model calls limit of ${models} fields exceeded: at most ${models} context or recall fields per request.`),
      );
      addValidationRule(
        rootFieldsRule(TIMELINE_FIELDS, timelines, `Timeline limit of ${timelines} exceeded: at most ${timelines} contextTimeline per request.`),
      );
      addValidationRule(
        rootFieldsRule(EXPORT_FIELDS, exports, `Export limit of ${exports} exceeded: at most ${exports} exportUser per request (GET /export/users/<endUserId> streams one person at a time).`),
      );
      return ({ valid, result, setResult }) => {
        if (!valid) setResult(result.map((error) => withCode(error as GraphQLError)));
      };
    },
    onExecute({ args, setResultAndStopExecution }) {
      const refusal = variablesRefusal(args.variableValues);
      if (refusal) return setResultAndStopExecution(refusal);
      return {
        onExecuteDone({ result, setResult }) {
          // Variable coercion errors (a wrong enum value, a wrong type) come back without a code
          // and without a path; resolver errors have a path and are left to error masking.
          const uncoded = (e: GraphQLError) => !e.path && !e.extensions?.code;
          if ("errors" in result && result.errors?.some(uncoded)) {
            setResult({ ...result, errors: result.errors.map((e) => (uncoded(e) ? withCode(e) : e)) });
          }
        },
      };
    },
    onSubscribe({ args, setResultAndStopExecution }) {
      const refusal = variablesRefusal(args.variableValues);
      if (refusal) setResultAndStopExecution(refusal);
    },
  };
}

// What a connection asked for without a size is counted as: its default page.
const DEFAULT_PAGE = 20;

/**
 * A field's cost is its own 1 plus its selection's, times the rows it may return: `first` or
 * `last` as the request gives them, variables and defaults included, else a default page.
 */
const rowsEstimator: ComplexityEstimator = ({ field, args, childComplexity }) => {
  if (field.name.startsWith("__")) return 0; // introspection (GraphiQL's, codegen's) is free
  const asked = [args.first, args.last].find((n): n is number => typeof n === "number");
  if (asked !== undefined) return 1 + childComplexity * Math.max(1, asked);
  if (getNamedType(field.type).name.endsWith("Connection")) return 1 + childComplexity * DEFAULT_PAGE;
};

const COST_ESTIMATORS = [rowsEstimator, simpleEstimator({ defaultComplexity: 1 })];

/** What an operation costs with these variables (rows it may return, nested pages multiplied); throws when they do not coerce. */
export function queryCost(args: { schema: GraphQLSchema; document: DocumentNode; variableValues?: unknown; operationName?: string | null }): number {
  return getComplexity({
    schema: args.schema,
    query: args.document,
    variables: (args.variableValues ?? {}) as Record<string, unknown>,
    operationName: args.operationName ?? undefined,
    estimators: COST_ESTIMATORS,
  });
}

/**
 * The request's cost, worked out once its variables are known (a limit checked at validation
 * counts `first: $n` as one row, so a page size in a variable escaped it): past `maxCost` it is
 * refused before any resolver runs. REST calls are counted too: their generated selections hold
 * no nested page (rest.ts), so they fit at any page size.
 */
export function useQueryCost(maxCost: number): Plugin {
  // A document that declares no Int or Boolean variable costs the same on every request (its page
  // sizes and @include conditions are in the text or the schema's defaults): its cost is kept,
  // keyed by the parsed document, which the parser's cache hands out again for the same text.
  const fixed = new WeakMap<DocumentNode, Map<string, number>>();
  type Args = Parameters<typeof queryCost>[0];
  const costOf = (args: Args): number | null => {
    const kept = fixed.get(args.document)?.get(args.operationName ?? "");
    if (kept !== undefined) return kept;
    let cost: number;
    try {
      cost = queryCost(args);
    } catch {
      return null; // variables that do not coerce: execution answers with its own typed error
    }
    if (!declaresCostVariable(args.document)) {
      const costs = fixed.get(args.document) ?? new Map<string, number>();
      fixed.set(args.document, costs.set(args.operationName ?? "", cost));
    }
    return cost;
  };
  const refusal = (args: Args) => {
    const cost = costOf(args);
    if (cost === null || cost <= maxCost) return null;
    return { errors: [new GraphQLError(`Query Cost limit of ${maxCost} exceeded, found ${cost}.`, { extensions: { code: "QUERY_TOO_COMPLEX" } })] };
  };
  return {
    onExecute({ args, setResultAndStopExecution }) {
      const refused = refusal(args);
      if (refused) setResultAndStopExecution(refused);
    },
    onSubscribe({ args, setResultAndStopExecution }) {
      const refused = refusal(args);
      if (refused) setResultAndStopExecution(refused);
    },
  };
}

/** Whether a variable could change the cost: a page size (Int), or an @include/@skip condition (Boolean). */
function declaresCostVariable(document: DocumentNode): boolean {
  return document.definitions.some(
    (definition) =>
      definition.kind === Kind.OPERATION_DEFINITION &&
      definition.variableDefinitions?.some((variable) => {
        let type: TypeNode = variable.type;
        while (type.kind !== Kind.NAMED_TYPE) type = type.type;
        return type.name.value === "Int" || type.name.value === "Boolean";
      }),
  );
}

/** graphql-armor options: a limit is reported as a validation error (with a code), not thrown. */
export const reportLimitErrors = {
  propagateOnRejection: false,
  onReject: [
    (context: ValidationContext | null, error: GraphQLError) => {
      if (!context) throw error;
      context.reportError(error);
    },
  ],
};

/** Errors from Pothos' own argument checks (page sizes, cursors) are the caller's mistakes. */
export function isInputValidationError(error: unknown): error is GraphQLError {
  return error instanceof Error && error.name === "PothosValidationError";
}
