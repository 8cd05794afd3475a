// What the remote (Streamable HTTP) peers share: their command line, the HTTP(S) listener on
// 127.0.0.1 with the `--require-header` gate and its RFC 9728 metadata, the `--drop-sse-after`
// cut, the `/debug` record, and `read_all`'s chunked `files/read` loop. See README.md
// ("Remote servers") for the interface.
import { createHash } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import https from "node:https";

/** Options every remote peer takes; fails with a usage line on anything else. */
export function parseArgs(argv, name) {
  const o = { tls: null, requireHeader: null, dropSseAfter: 0, bodyLimit: undefined };
  const usage = () => {
    process.stderr.write(
      `usage: ${name} [--tls CERT KEY] [--require-header NAME:VALUE] [--drop-sse-after N] [--body-limit BYTES]\n`,
    );
    process.exit(2);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--tls" && i + 2 < argv.length) {
      o.tls = { cert: fs.readFileSync(argv[i + 1]), key: fs.readFileSync(argv[i + 2]) };
      i += 2;
    } else if (a === "--require-header" && i + 1 < argv.length) {
      const v = argv[++i];
      const colon = v.indexOf(":");
      if (colon <= 0) usage();
      o.requireHeader = { name: v.slice(0, colon).trim().toLowerCase(), value: v.slice(colon + 1).trim() };
    } else if (a === "--drop-sse-after" && i + 1 < argv.length) {
      o.dropSseAfter = Number(argv[++i]);
      if (!Number.isInteger(o.dropSseAfter) || o.dropSseAfter < 1) usage();
    } else if (a === "--body-limit" && i + 1 < argv.length) {
      o.bodyLimit = Number(argv[++i]);
      if (!Number.isInteger(o.bodyLimit) || o.bodyLimit < 1) usage();
    } else {
      usage();
    }
  }
  return o;
}

export const log = (name) => (...parts) => process.stderr.write(`[${name}] ${parts.join(" ")}\n`);

/**
 * Cuts an SSE response after its `n`th event (comments such as keep-alives do not count):
 * the event is flushed, then the socket is destroyed without the chunked terminator, as a
 * dropped connection looks to the client (the response never ends, so no client reuses it).
 */
export function dropAfter(res, n, onDrop) {
  let events = 0;
  const write = res.write.bind(res);
  res.write = (chunk, ...rest) => {
    const text = Buffer.isBuffer(chunk) || chunk instanceof Uint8Array ? Buffer.from(chunk).toString("utf8") : String(chunk);
    // Headers given to writeHead are not visible to getHeader: an SSE event is known by its
    // first field instead.
    if (!/^(id|event|data|retry):/.test(text)) return write(chunk, ...rest);
    events += text.split("\n\n").length - 1;
    if (events < n) return write(chunk, ...rest);
    res.write = () => true; // nothing more goes out on this response
    // Nor its end: the SDK ends a POST stream right after its answer, and a terminator sent
    // before the socket is destroyed would make the response whole, the connection reusable
    // by the client's pool, and the destroy a cut of the client's next request instead.
    res.end = () => res;
    onDrop?.();
    return write(chunk, () => res.destroy());
  };
}

/**
 * Serves `handler(req, res, base)` on 127.0.0.1 (port 0), HTTP or HTTPS, behind the
 * `--require-header` gate; prints `{"url": BASE/mcp}` once listening and exits when stdin
 * closes. `debug()` is served as JSON at GET /debug (outside the gate, for the tests).
 */
export function listen(opts, name, handler, debug) {
  const say = log(name);
  const scheme = opts.tls ? "https" : "http";
  let base = "";
  const metadataPath = "/.well-known/oauth-protected-resource";
  const serve = async (req, res) => {
    try {
      const url = new URL(req.url, base);
      if (req.method === "GET" && url.pathname.startsWith(metadataPath)) {
        // RFC 9728 protected resource metadata; no authorization server really exists.
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            resource: `${base}/mcp`,
            authorization_servers: [`${base}/`],
            bearer_methods_supported: ["header"],
            resource_name: name,
          }),
        );
        return;
      }
      if (req.method === "GET" && url.pathname === "/debug") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(debug()));
        return;
      }
      if (url.pathname !== "/mcp") {
        res.writeHead(404, { "content-type": "text/plain" });
        res.end("not found\n");
        return;
      }
      // Only the MCP endpoint is protected, as a resource server does: OAuth discovery
      // probes elsewhere get 404, and no authorization server is offered.
      const gate = opts.requireHeader;
      if (gate && req.headers[gate.name] !== gate.value) {
        say(`401 for ${req.method} ${url.pathname}: header ${gate.name} missing or wrong`);
        res.writeHead(401, {
          "content-type": "application/json",
          "www-authenticate": `Bearer resource_metadata="${base}${metadataPath}"`,
        });
        res.end(JSON.stringify({ error: "unauthorized", error_description: `${gate.name} required` }));
        return;
      }
      await handler(req, res, base);
    } catch (e) {
      say(`error on ${req.method} ${req.url}: ${e?.stack ?? e}`);
      if (!res.headersSent) {
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32603, message: String(e) }, id: null }));
      } else {
        res.destroy();
      }
    }
  };
  const server = opts.tls ? https.createServer({ cert: opts.tls.cert, key: opts.tls.key }, serve) : http.createServer(serve);
  server.listen(0, "127.0.0.1", () => {
    base = `${scheme}://127.0.0.1:${server.address().port}`;
    process.stdout.write(`${JSON.stringify({ url: `${base}/mcp` })}\n`);
    say(`listening on ${base}/mcp`);
  });
  // The test holds our stdin: when it goes away (or the test dies) so do we.
  process.stdin.on("data", () => {});
  process.stdin.on("end", () => process.exit(0));
  process.stdin.on("close", () => process.exit(0));
  process.on("SIGTERM", () => process.exit(0));
  return server;
}

/** The SDKs' default bound on a POST body (both TypeScript SDKs and the Python SDK 1.x). */
export const SDK_BODY_LIMIT = 4 * 1024 * 1024;

/**
 * Reads a POST body as JSON, or answers 413 and returns `TOO_LARGE` past `limit` bytes (declared
 * or sent). The peers parse bodies themselves to route them, and the SDKs do not bound a body
 * handed to them already parsed: this is where the limit is kept.
 */
export const TOO_LARGE = Symbol("too large");
export async function readBody(req, res, limit = SDK_BODY_LIMIT) {
  const tooLarge = () => {
    res.writeHead(413, { "content-type": "application/json" });
    res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: `Payload Too Large: body over ${limit} bytes` }, id: null }));
    req.resume();
    return TOO_LARGE;
  };
  if (Number(req.headers["content-length"] ?? 0) > limit) return tooLarge();
  const parts = [];
  let size = 0;
  for await (const p of req) {
    size += p.length;
    if (size > limit) return tooLarge();
    parts.push(p);
  }
  const text = Buffer.concat(parts).toString("utf8");
  try {
    return text ? JSON.parse(text) : undefined;
  } catch {
    return null; // the SDK answers an unparsable body itself
  }
}

/** A request to the client whose JSON-RPC error comes back as data, not as a throw. */
export async function ask(send, method, params) {
  try {
    return { result: await send(params === undefined ? { method } : { method, params }) };
  } catch (e) {
    return { error: { code: e.code, message: e.message, data: e.data } };
  }
}

/**
 * Reads `path` whole through `files/read` in base64 chunks of `chunk` bytes, moving on by
 * the `length` each answer says it covers (a clamped answer is simply continued), until `eof`.
 */
export async function readAll(send, path, chunk) {
  const hash = createHash("sha256");
  const out = { bytes: 0, sha256: "", reads: 0, clamped: 0, errors: [] };
  let offset = 0;
  for (;;) {
    const r = await ask(send, "files/read", { path, offset, length: chunk, encoding: "base64" });
    out.reads += 1;
    if (r.error) {
      out.errors.push({ offset, ...r.error });
      break;
    }
    const a = r.result;
    const bytes = Buffer.from(a.content, a.encoding === "base64" ? "base64" : "utf8");
    if (bytes.length !== a.length) out.errors.push({ offset, message: `decoded ${bytes.length} bytes, answer says length ${a.length}` });
    hash.update(bytes);
    offset += a.length;
    if (a.length < chunk && !a.eof) out.clamped += 1;
    if (a.eof) break;
    if (a.length === 0) {
      out.errors.push({ offset, message: "empty chunk before eof" });
      break;
    }
  }
  out.bytes = offset;
  out.sha256 = hash.digest("hex");
  return out;
}

export const jsonText = (value) => ({ content: [{ type: "text", text: JSON.stringify(value) }] });
