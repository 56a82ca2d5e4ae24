import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestEngram, type TestEngram } from "./helpers/engram.ts";

let engram: TestEngram;
let url: string;
beforeAll(async () => {
  engram = await startTestEngram();
  url = await engram.listen();
});
afterAll(() => engram?.stop());

const post = (body: string, key = engram.tenant.writer) =>
  fetch(`${url}/graphql`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body,
  });

/** An appendEvent request whose JSON body is about `bytes` long. */
function appendBody(bytes: number, sourceRef: string) {
  const envelope = JSON.stringify({
    query: `mutation($input: AppendEventInput!) { appendEvent(input: $input) { id } }`,
    variables: { input: { scope: "TEAM", scopeRef: "limits", kind: "note", body: "", source: "limits", sourceRef } },
  });
  return envelope.replace(`"body":""`, `"body":"${"x".repeat(bytes - envelope.length)}"`);
}

// armor counts every field on the path, the leaf included.
const TEN_DEEP = `{ entries { edges { node { events { edges { node { entry { events { edges { cursor } } } } } } } } } }`;
const ELEVEN_DEEP = `{ entries { edges { node { events { edges { node { entry { events { edges { node { id } } } } } } } } } } }`;

describe("requests that are not GraphQL over HTTP", () => {
  it("are BAD_REQUEST (400 for a body that is not JSON or a batch), and leave nothing in the server's error log", async () => {
    const errors: string[] = [];
    const error = engram.services.log.error.bind(engram.services.log);
    engram.services.log.error = (message: string, fields?: object) => {
      errors.push(message);
      error(message, fields);
    };
    try {
      for (const [body, status] of [["{not json", 400], ["[]", 400], ["{}", 200]] as const) {
        const response = await post(body);
        expect(response.status, body).toBe(status);
        expect((await response.json()).errors[0].extensions.code, body).toBe("BAD_REQUEST");
      }
      // A client's mistake, not the server's: nothing an operator has to read.
      expect(errors).toEqual([]);
    } finally {
      engram.services.log.error = error;
    }
  });
});

describe("request limits", () => {
  it("refuses a request body over 1,000,000 bytes with HTTP 413 and writes nothing", async () => {
    const body = appendBody(1_000_100, "too-big");
    expect(Buffer.byteLength(body)).toBeGreaterThan(1_000_000);
    const response = await post(body);
    expect(response.status).toBe(413);
    const json = await response.json();
    expect(json.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(await engram.services.db.memoryEvent.count({ where: { sourceRef: "too-big" } })).toBe(0);
  });

  it("refuses a chunked body (no Content-Length) with HTTP 411, whatever its size, and writes nothing", async () => {
    const body = appendBody(1_200_000, "chunked");
    const stream = new ReadableStream({
      start(controller) {
        for (let i = 0; i < body.length; i += 64_000) controller.enqueue(new TextEncoder().encode(body.slice(i, i + 64_000)));
        controller.close();
      },
    });
    const response = await fetch(`${url}/graphql`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${engram.tenant.writer}` },
      body: stream,
      duplex: "half",
    } as RequestInit);
    expect(response.status).toBe(411);
    expect(await engram.services.db.memoryEvent.count({ where: { sourceRef: "chunked" } })).toBe(0);
  });

  it("accepts a body just under the limit (rejected only by the event's own size limit)", async () => {
    const response = await post(appendBody(999_000, "just-under"));
    expect(response.status).toBe(200);
    const json = await response.json();
    // 999 kB passes the transport; the event body limit (64,000 characters) then applies.
    expect(json.errors?.[0].extensions?.code).toBe("BAD_USER_INPUT");
    expect(json.errors?.[0].message).toMatch(/body/);
  });

  it("rejects a query deeper than 10 levels, and runs one 10 levels deep", async () => {
    const ok = await engram.gql(TEN_DEEP, {}, engram.tenant.reader);
    expect(ok.errors).toBeUndefined();
    const tooDeep = await engram.gql(ELEVEN_DEEP, {}, engram.tenant.reader);
    expect(tooDeep.errors?.[0].message).toMatch(/depth/i);
    expect(tooDeep.data ?? null).toBeNull();
  });

  it("rejects more than 30 aliases, and runs 30", async () => {
    const aliased = (n: number) => `{ ${Array.from({ length: n }, (_, i) => `v${i}: viewer { role }`).join(" ")} }`;
    const ok = await engram.gql(aliased(30), {}, engram.tenant.reader);
    expect(ok.errors).toBeUndefined();
    expect(Object.keys(ok.data)).toHaveLength(30);
    const tooMany = await engram.gql(aliased(31), {}, engram.tenant.reader);
    expect(tooMany.errors?.[0].message).toMatch(/alias/i);
    expect(tooMany.data ?? null).toBeNull();
  });
});
