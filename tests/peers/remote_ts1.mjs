// A remote MCP server (2025 era) made with the TypeScript SDK 1.x: `McpServer` over
// `StreamableHTTPServerTransport`, stateful (one transport and server per `Mcp-Session-Id`),
// answering with SSE streams (not JSON), with an event store so that a dropped stream can be
// resumed with `Last-Event-ID`. Its tools send `roots/list` and `files/*` requests to the
// client (the broker, through whatever bridges the two). Interface: README.md, "Remote servers".
//
//   node remote_ts1.mjs [--tls CERT KEY] [--require-header NAME:VALUE] [--drop-sse-after N]
//                       [--body-limit BYTES]   (default: the SDK's own limit, 4 MiB)
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { TOO_LARGE, ask, dropAfter, jsonText, listen, log, parseArgs, readAll, readBody } from "./remote_lib.mjs";

const NAME = "remote_ts1";
const opts = parseArgs(process.argv.slice(2), NAME);
const say = log(NAME);
const Anything = z.unknown();

/**
 * Events kept in arrival order (a Map keeps insertion order), so a resume replays the rest of
 * its stream exactly. Priming events (empty messages) are stored so their ids resolve, but not
 * replayed: they carry no message.
 */
class EventStore {
  constructor() {
    this.events = new Map();
    this.next = 0;
  }
  async storeEvent(streamId, message) {
    const id = `${streamId}_${++this.next}`;
    this.events.set(id, { streamId, message });
    return id;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const from = this.events.get(lastEventId);
    if (!from) return "";
    let after = false;
    for (const [id, e] of this.events) {
      if (id === lastEventId) after = true;
      else if (after && e.streamId === from.streamId && e.message?.jsonrpc) await send(id, e.message);
    }
    return from.streamId;
  }
}

const sessions = new Map(); // id → { transport, gets: [...], drops }
const deletedSessions = [];
const expiredSessions = [];
const getStreams = []; // every GET: { session, lastEventId }
let drops = 0;

function newSession() {
  const record = { gets: [], drops: 0, earlyRoots: Promise.resolve({ error: { message: "no initialized notification seen" } }) };
  const server = new McpServer({ name: "fsbroker-remote-ts1", version: "0.0.0" });
  const protocol = server.server;
  // On the GET stream (no related request) or on the tool call's own POST stream.
  const sender = (extra, stream) => (req) =>
    stream === "get" ? protocol.request(req, Anything) : extra.sendRequest(req, Anything);

  protocol.oninitialized = () => {
    // Sent the moment the session is initialized, on the GET stream: lost unless the client
    // opened that stream at once (the timeout keeps the tool from waiting a minute for it).
    record.earlyRoots = ask((req) => protocol.request(req, Anything, { timeout: 15_000 }), "roots/list");
  };
  server.registerTool("early_roots", { inputSchema: {} }, async () => jsonText(await record.earlyRoots));
  server.registerTool(
    "request",
    {
      inputSchema: {
        method: z.string(),
        params: z.record(z.string(), z.unknown()).optional(),
        stream: z.enum(["post", "get"]).optional(),
      },
    },
    async ({ method, params, stream }, extra) => jsonText(await ask(sender(extra, stream), method, params)),
  );
  server.registerTool(
    "read_all",
    { inputSchema: { path: z.string(), chunk: z.number().int().positive(), stream: z.enum(["post", "get"]).optional() } },
    async ({ path, chunk, stream }, extra) => jsonText(await readAll(sender(extra, stream), path, chunk)),
  );
  server.registerTool("expire_session", { inputSchema: {} }, async () => {
    // Forgotten at once, so the next request with this id gets 404; this answer still goes
    // out on the stream that is open now.
    const id = transport.sessionId;
    sessions.delete(id);
    expiredSessions.push(id);
    setTimeout(() => transport.close().catch(() => {}), 2000).unref();
    say(`expired session ${id}`);
    return jsonText({ expired: id });
  });
  server.registerTool("sse_count", { inputSchema: {} }, async () => jsonText({ gets: record.gets, drops: record.drops }));

  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    eventStore: new EventStore(),
    maxRequestBodySize: opts.bodyLimit,
    onsessioninitialized: (id) => {
      sessions.set(id, { transport, record });
      say(`new session ${id}`);
    },
    onsessionclosed: (id) => {
      sessions.delete(id);
      deletedSessions.push(id);
      say(`deleted session ${id}`);
    },
  });
  transport.onerror = (e) => say(`transport: ${e.message}`);
  return { server, transport, record };
}

listen(
  opts,
  NAME,
  async (req, res) => {
    const id = req.headers["mcp-session-id"];
    let body;
    if (req.method === "POST") {
      body = await readBody(req, res, opts.bodyLimit);
      if (body === TOO_LARGE) return;
    }
    let entry = id ? sessions.get(id) : undefined;
    if (id && !entry) {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32001, message: "Session not found" }, id: null }));
      return;
    }
    if (!entry) {
      if (req.method !== "POST" || !isInitializeRequest(body)) {
        res.writeHead(400, { "content-type": "application/json" });
        res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "no session: initialize first" }, id: null }));
        return;
      }
      const s = newSession();
      await s.server.connect(s.transport);
      entry = { transport: s.transport, record: s.record };
    }
    if (req.method === "GET") {
      const got = { session: id, lastEventId: req.headers["last-event-id"] ?? null };
      getStreams.push(got);
      entry.record.gets.push(got.lastEventId);
    }
    if (opts.dropSseAfter) {
      dropAfter(res, opts.dropSseAfter, () => {
        drops += 1;
        entry.record.drops += 1;
        say(`dropping the SSE stream of ${req.method} after ${opts.dropSseAfter} events`);
      });
    }
    await entry.transport.handleRequest(req, res, body);
  },
  () => ({ sessions: [...sessions.keys()], deleted_sessions: deletedSessions, expired_sessions: expiredSessions, get_streams: getStreams, drops }),
);
