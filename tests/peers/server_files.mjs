// A test MCP server made with the official TypeScript SDK (McpServer over stdio) whose tools
// send `roots/list` and every `files/*` method to the client, i.e. to `fsbroker proxy` in
// front of the host. Results (or JSON-RPC errors) come back as JSON tool output.
//
// It also sends a `roots/list` the moment the host's `initialize` arrives, before the
// handshake has finished (servers should not; some do), and receives the broker's
// `notifications/files/changed`.
//
// Tools:
//   client_caps                    the client capabilities in `initialize`: {raw, parsed}
//   early_roots                    the answer to the `roots/list` sent during the handshake
//   request {method, params}       any request to the client: {result} or {error}
//   watch_roundtrip {dir, name, content}
//       files/watch dir, files/write dir/name, wait for notifications/files/changed,
//       files/unwatch, write again and check that no notification follows
//   burst {n, path}                n requests to the client at once (roots/list and files/read)
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const Anything = z.unknown();

const server = new McpServer({ name: "fsbroker-peer-files-server", version: "0.0.0" });
const protocol = server.server;

/** A request to the client; the JSON-RPC error comes back as data, not as a throw. */
async function ask(method, params) {
  try {
    return { result: await protocol.request(params === undefined ? { method } : { method, params }, Anything) };
  } catch (e) {
    return { error: { code: e.code, message: e.message, data: e.data } };
  }
}

const json = (value) => ({ content: [{ type: "text", text: JSON.stringify(value) }] });

// notifications/files/changed, kept with their arrival time; waiters are woken on each one.
const changes = [];
let wake = [];
protocol.setNotificationHandler(
  z.object({ method: z.literal("notifications/files/changed"), params: z.looseObject({}) }),
  (n) => {
    changes.push({ ...n.params, receivedAt: Date.now() });
    const w = wake;
    wake = [];
    w.forEach((f) => f());
  },
);
async function waitChange(match, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    const hit = changes.find(match);
    if (hit) return hit;
    const left = deadline - Date.now();
    if (left <= 0) return undefined;
    // The timer is cleared when a notification wakes us: a pending timer would keep this
    // process alive after the host hangs up.
    await new Promise((r) => {
      const t = setTimeout(r, left);
      wake.push(() => {
        clearTimeout(t);
        r();
      });
    });
  }
}

// `raw`: the capabilities as they arrived on the wire; `parsed`: what the SDK keeps of them
// (its schema drops members of `roots` it does not know, such as `filesystemBrokering`).
let rawCapabilities = null;
server.registerTool("client_caps", { inputSchema: {} }, async () =>
  json({ raw: rawCapabilities, parsed: protocol.getClientCapabilities() ?? null }),
);

let earlyRoots = Promise.resolve({ error: { message: "no initialize seen" } });
server.registerTool("early_roots", { inputSchema: {} }, async () => json(await earlyRoots));

server.registerTool(
  "request",
  { inputSchema: { method: z.string(), params: z.record(z.string(), z.unknown()).optional() } },
  async ({ method, params }) => json(await ask(method, params)),
);

server.registerTool(
  "watch_roundtrip",
  { inputSchema: { dir: z.string(), name: z.string(), content: z.string() } },
  async ({ dir, name, content }) => {
    const out = { steps: [] };
    const step = async (label, method, params) => {
      const r = await ask(method, params);
      out.steps.push({ label, ...r });
      return r;
    };
    const w = await step("watch", "files/watch", { path: dir });
    if (!w.result?.watchId) return json(out);
    const watchId = w.result.watchId;
    const target = `${dir}/${name}`;
    await step("write", "files/write", { path: target, content });
    out.change = await waitChange((c) => c.watchId === watchId && c.path === target, 10_000);
    await step("unwatch", "files/unwatch", { watchId });
    const after = Date.now();
    await step("write after unwatch", "files/write", { path: target, content: `${content} again` });
    // A notification for this watch after unwatch would be a leak; 500 ms is ten times the
    // broker's coalescing window.
    out.afterUnwatch = await waitChange((c) => c.watchId === watchId && c.receivedAt > after, 500);
    out.seen = changes.filter((c) => c.watchId === watchId);
    return json(out);
  },
);

server.registerTool(
  "burst",
  { inputSchema: { n: z.number().int(), path: z.string() } },
  async ({ n, path }) => {
    const all = await Promise.all(
      Array.from({ length: n }, (_, i) => (i % 2 ? ask("roots/list") : ask("files/read", { path }))),
    );
    return json(all);
  },
);

const transport = new StdioServerTransport();
// Set before connect: the SDK chains it, so this sees the host's `initialize` before the
// server answers it, and sends a request to the client in the middle of the handshake.
transport.onmessage = (msg) => {
  if (msg.method === "initialize") {
    rawCapabilities = msg.params?.capabilities ?? null;
    earlyRoots = ask("roots/list");
  }
};
await server.connect(transport);
