// The TypeScript SDK's own OAuth example, as a peer: `simpleStreamableHttp.js --oauth` (or
// `--oauth --oauth-strict`, which checks the token's `resource`) with its demo authorization
// server (dynamic registration, PKCE, an authorize endpoint that approves at once, tokens in
// memory). The example hard-codes its ports' environment variables and `localhost`; this
// wrapper picks two free ports (or takes `--ports MCP AUTH`, to start it again where it was),
// waits until both servers answer their metadata, and prints the peer's one line,
// `{"url":"http://localhost:MCP/mcp","auth":"http://localhost:AUTH/"}`. It runs until its
// stdin closes. Interface: README.md, "Remote servers".
//
//   node oauth_demo.mjs --oauth [--oauth-strict] [--ports MCP AUTH]
import net from "node:net";

const args = process.argv.slice(2);
const at = args.indexOf("--ports");
const free = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
const [mcp, auth] = at >= 0 ? [Number(args[at + 1]), Number(args[at + 2])] : [await free(), await free()];
process.env.MCP_PORT = String(mcp);
process.env.MCP_AUTH_PORT = String(auth);
// The example's own logs go to stderr: stdout carries this peer's one line.
console.log = (...a) => console.error(...a);
// One correction to the demo, so that a restarted server answers a token it no longer knows
// as a resource server does (RFC 6750 §3.1: 401 invalid_token): its introspection endpoint
// answers an unknown token with HTTP 401 where RFC 7662 §2.2 says 200 `{"active":false}`,
// and the example's verifier turns that into a plain Error, which the SDK's middleware
// answers with 500. Answered as RFC 7662 says, the middleware finds no expiry (or no
// resource) and answers 401 with its challenge.
const realFetch = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const response = await realFetch(input, init);
  if (String(input).endsWith("/introspect") && response.status === 401) {
    return new Response(JSON.stringify({ active: false }), { status: 200, headers: { "content-type": "application/json" } });
  }
  return response;
};
// The example as the pinned SDK ships it (its package's `exports` do not name examples).
await import(new URL("./node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js", import.meta.url).href);

const until = Date.now() + 30000;
for (const url of [
  `http://localhost:${auth}/.well-known/oauth-authorization-server`,
  `http://localhost:${mcp}/.well-known/oauth-protected-resource/mcp`,
]) {
  for (;;) {
    try {
      if ((await fetch(url)).ok) break;
    } catch {}
    if (Date.now() > until) {
      console.error(`oauth_demo: ${url} never answered`);
      process.exit(1);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}
process.stdout.write(JSON.stringify({ url: `http://localhost:${mcp}/mcp`, auth: `http://localhost:${auth}/` }) + "\n");
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
