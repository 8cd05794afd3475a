// A remote MCP server of the 2026-07-28 era made with the TypeScript SDK 2.x: `createMcpHandler`
// (stateless, per-request, `legacy: 'reject'`) served over node:http. The handler keeps the
// revision's header checks: a `tools/call` without `MCP-Protocol-Version`, `Mcp-Method` and
// `Mcp-Name` is answered HTTP 400 / -32020. A server asks the client things through
// `input_required` results (no server → client requests in this era). Interface: README.md,
// "Remote servers".
//
//   node remote_ts2.mjs [--tls CERT KEY] [--require-header NAME:VALUE] [--body-limit BYTES]
//
// roots/list goes out through the SDK (`inputRequired.listRoots()`). The SDK refuses to emit a
// `files/*` input request ("not an embedded request the 2026-07-28 revision defines") and drops
// `files/*` input responses before the handler sees them, so for those the handler writes the
// input_required result itself (handWritten below, put on the wire by this file's HTTP layer)
// and reads the answers from the raw request body.
import { AsyncLocalStorage } from "node:async_hooks";
import { createHash, randomUUID } from "node:crypto";
import { Readable } from "node:stream";
import { McpServer, createMcpHandler, inputRequired, inputResponse } from "@modelcontextprotocol/server";
import * as z from "zod/v4";
import { TOO_LARGE, jsonText, listen, log, parseArgs, readBody } from "./remote_lib.mjs";

const NAME = "remote_ts2";
const opts = parseArgs(process.argv.slice(2), NAME);
if (opts.dropSseAfter) {
  process.stderr.write(`${NAME}: --drop-sse-after needs a stateful server (this one answers with JSON)\n`);
  process.exit(2);
}
const say = log(NAME);
const HAND = "io.github.fsbroker.test/input-required";

/** The raw `inputResponses` and `requestState` of the request being served (see above). */
const raw = new AsyncLocalStorage();

/** A result this file's HTTP layer turns into `{resultType: "input_required", ...}`. */
const handWritten = (inputRequests, requestState) => ({
  content: [{ type: "text", text: "input required (hand-written)" }],
  _meta: { [HAND]: { inputRequests, requestState } },
});

/** The answer to the input request `key` of the previous round, as sent: `{result}` or `{error}`. */
function answer(key) {
  const got = raw.getStore()?.inputResponses?.[key];
  if (got === undefined) return undefined;
  return got?.error !== undefined && Object.keys(got).length === 1 ? { error: got.error } : { result: got };
}

// read_all's running hashes, by the token its requestState carries: the SDK's handler is
// stateless, but a sha256 in progress cannot travel in requestState.
const reads = new Map();

function factory() {
  const server = new McpServer({ name: "fsbroker-remote-ts2", version: "0.0.0" }, { capabilities: { tools: {} } });
  server.registerTool(
    "request",
    { inputSchema: z.object({ method: z.string(), params: z.record(z.string(), z.unknown()).optional() }) },
    async ({ method, params }, ctx) => {
      if (method === "roots/list") {
        const r = inputResponse(ctx.mcpReq.inputResponses, "r");
        if (r.kind !== "roots") return inputRequired({ inputRequests: { r: inputRequired.listRoots() } });
        return jsonText({ result: { roots: r.roots } });
      }
      const got = answer("r");
      if (got !== undefined) return jsonText(got);
      return handWritten({ r: { method, params: params ?? {} } }, `request:${method}`);
    },
  );
  server.registerTool(
    "read_all",
    { inputSchema: z.object({ path: z.string(), chunk: z.number().int().positive() }) },
    async ({ path, chunk }) => {
      const state = raw.getStore()?.requestState;
      let token = state?.startsWith("read_all:") ? state.slice("read_all:".length) : undefined;
      let run = token && reads.get(token);
      if (!run) {
        token = randomUUID();
        run = { hash: createHash("sha256"), offset: 0, out: { bytes: 0, sha256: "", reads: 0, clamped: 0, errors: [] } };
        reads.set(token, run);
      } else {
        const got = answer("chunk");
        run.out.reads += 1;
        let done = false;
        if (!got) {
          run.out.errors.push({ offset: run.offset, message: "no answer to the files/read input request" });
          done = true;
        } else if (got.error) {
          run.out.errors.push({ offset: run.offset, ...got.error });
          done = true;
        } else {
          const a = got.result;
          const bytes = Buffer.from(a.content, a.encoding === "base64" ? "base64" : "utf8");
          if (bytes.length !== a.length) run.out.errors.push({ offset: run.offset, message: `decoded ${bytes.length}, length ${a.length}` });
          run.hash.update(bytes);
          run.offset += a.length;
          if (a.length < chunk && !a.eof) run.out.clamped += 1;
          if (a.length === 0 && !a.eof) run.out.errors.push({ offset: run.offset, message: "empty chunk before eof" });
          done = a.eof || a.length === 0;
        }
        if (done) {
          reads.delete(token);
          return jsonText({ ...run.out, bytes: run.offset, sha256: run.hash.digest("hex") });
        }
      }
      return handWritten(
        { chunk: { method: "files/read", params: { path, offset: run.offset, length: chunk, encoding: "base64" } } },
        `read_all:${token}`,
      );
    },
  );
  return server;
}

const handler = createMcpHandler(factory, {
  legacy: "reject",
  responseMode: "json",
  maxRequestBodySize: opts.bodyLimit,
  onerror: (e) => say(`handler: ${e.message}`),
});

listen(
  opts,
  NAME,
  async (req, res, base) => {
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) {
      for (const one of Array.isArray(v) ? v : [v]) if (one !== undefined) headers.append(k, one);
    }
    const url = new URL(req.url, base);
    let body;
    let request;
    if (req.method === "POST") {
      body = await readBody(req, res, opts.bodyLimit);
      if (body === TOO_LARGE) return;
      request = new Request(url, { method: "POST", headers, body: JSON.stringify(body ?? null) });
    } else {
      request = new Request(url, { method: req.method, headers, body: req.method === "GET" || req.method === "HEAD" ? undefined : Readable.toWeb(req), duplex: "half" });
    }
    const store = { inputResponses: body?.params?.inputResponses, requestState: body?.params?.requestState };
    const response = await raw.run(store, () => handler.fetch(request, body === undefined ? undefined : { parsedBody: body }));
    const out = {};
    response.headers.forEach((v, k) => {
      out[k] = v;
    });
    const type = response.headers.get("content-type") ?? "";
    if (type.startsWith("application/json")) {
      let text = await response.text();
      const msg = text ? JSON.parse(text) : null;
      const hand = msg?.result?._meta?.[HAND];
      if (hand) {
        msg.result = { resultType: "input_required", inputRequests: hand.inputRequests, requestState: hand.requestState };
        text = JSON.stringify(msg);
        delete out["content-length"];
      }
      res.writeHead(response.status, out);
      res.end(text);
      return;
    }
    res.writeHead(response.status, out);
    if (response.body) {
      for await (const part of response.body) res.write(part);
    }
    res.end();
  },
  () => ({ pending_reads: reads.size }),
);
