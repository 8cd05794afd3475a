#!/usr/bin/env node
// A tiny stdio MCP server for tests/bench.rs (`fsbroker bench --compare-mcp`): plain Node.js,
// no dependencies. One JSON-RPC message per line.
//
//   node tiny_fs_server.mjs [--text-only] DIR
//
// Methods: initialize, ping, tools/list, tools/call with read_text_file and read_media_file
// ({path}: absolute, inside DIR). --text-only leaves read_media_file out.
//
// It also checks the client: initialize must ask for protocol 2025-06-18 as
// `fsbroker-bench`; when the client declares `roots`, the server sends it `roots/list` (which
// must come back with DIR as a file:// root) and an unknown request (which must come back as
// an error) right after `notifications/initialized`. Tool calls fail (isError) with the
// problems found, so the bench reports them.

import { readFileSync, realpathSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const args = process.argv.slice(2);
const textOnly = args.includes("--text-only");
const dirArg = args.filter((a) => a !== "--text-only")[0];
if (!dirArg) {
  console.error("usage: tiny_fs_server.mjs [--text-only] DIR");
  process.exit(2);
}
const root = realpathSync(dirArg);

const problems = [];
// Answers due from the client, by the id of our request.
const due = new Map();
let clientRoots = false;

function send(message) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...message }) + "\n");
}

function ask(id, method, check) {
  due.set(id, check);
  send({ id, method });
}

function inside(p) {
  if (typeof p !== "string" || !path.isAbsolute(p)) {
    throw new Error(`not an absolute path: ${p}`);
  }
  const real = realpathSync(p);
  if (real !== root && !real.startsWith(root + path.sep)) {
    throw new Error(`outside ${root}: ${p}`);
  }
  return real;
}

const tools = [
  {
    name: "read_text_file",
    description: "Read a file as UTF-8 text.",
    inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
  {
    name: "read_media_file",
    description: "Read a file as base64 (image/png for .png, else an embedded resource).",
    inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
].filter((t) => !(textOnly && t.name === "read_media_file"));

function call(name, args) {
  if (!tools.some((t) => t.name === name)) {
    return { content: [{ type: "text", text: `unknown tool ${name}` }], isError: true };
  }
  if (clientRoots && due.size > 0) {
    problems.push(`a tool call before the client answered ${[...due.keys()].join(", ")}`);
  }
  if (problems.length > 0) {
    return { content: [{ type: "text", text: problems.join("; ") }], isError: true };
  }
  try {
    const file = inside(args?.path);
    if (name === "read_text_file") {
      return { content: [{ type: "text", text: readFileSync(file, "utf8") }] };
    }
    const data = readFileSync(file).toString("base64");
    const block = file.endsWith(".png")
      ? { type: "image", data, mimeType: "image/png" }
      : {
          type: "resource",
          resource: { uri: pathToFileURL(file).href, mimeType: "application/octet-stream", blob: data },
        };
    return { content: [block] };
  } catch (e) {
    return { content: [{ type: "text", text: String(e?.message ?? e) }], isError: true };
  }
}

function handle(message) {
  const { id, method, params } = message;
  if (method === undefined) {
    // An answer to one of our requests.
    const check = due.get(id);
    if (!check) {
      problems.push(`an answer to no request: ${JSON.stringify(message)}`);
      return;
    }
    due.delete(id);
    const problem = check(message);
    if (problem) problems.push(problem);
    return;
  }
  if (id === undefined) {
    if (method === "notifications/initialized" && clientRoots) {
      const want = pathToFileURL(root).href;
      ask("tiny-roots", "roots/list", (m) =>
        m.result?.roots?.some((r) => r.uri === want || r.uri === want + "/")
          ? null
          : `roots/list answered ${JSON.stringify(m)}, not ${want}`,
      );
      ask("tiny-unknown", "tiny/unknown", (m) =>
        m.error ? null : `tiny/unknown answered without an error: ${JSON.stringify(m)}`,
      );
    }
    return;
  }
  switch (method) {
    case "initialize":
      if (params?.protocolVersion !== "2025-06-18") {
        problems.push(`initialize asked for protocol ${params?.protocolVersion}`);
      }
      if (params?.clientInfo?.name !== "fsbroker-bench") {
        problems.push(`initialize came from ${JSON.stringify(params?.clientInfo)}`);
      }
      clientRoots = Boolean(params?.capabilities?.roots);
      return send({
        id,
        result: {
          protocolVersion: "2025-06-18",
          capabilities: { tools: {} },
          serverInfo: { name: "tiny-fs-server", version: "1.0.0" },
        },
      });
    case "ping":
      return send({ id, result: {} });
    case "tools/list":
      return send({ id, result: { tools } });
    case "tools/call":
      return send({ id, result: call(params?.name, params?.arguments) });
    default:
      return send({ id, error: { code: -32601, message: `no method ${method}` } });
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (line.trim() === "") return;
  let message;
  try {
    message = JSON.parse(line);
  } catch (e) {
    send({ id: null, error: { code: -32700, message: `parse error: ${e.message}` } });
    return;
  }
  handle(message);
});
lines.on("close", () => process.exit(0));
