#!/usr/bin/env node
// Tries each operation of $PROBE (a JSON list of [kind, arg]) and writes the results as one
// JSON-RPC notification, {"method":"probe","params":{"results":[...]}}: "ok", "ok:TEXT" or
// "err:CODE". Then it answers `initialize` and `ping` like a server until stdin closes.
"use strict";
const fs = require("node:fs");
const net = require("node:net");

function attempt(op) {
  const [kind, arg] = op;
  return new Promise((resolve) => {
    const done = (e, text) => resolve(e ? "err:" + (e.code || e.message) : text === undefined ? "ok" : "ok:" + text);
    try {
      if (kind === "read") return done(null, fs.readFileSync(arg, "utf8"));
      if (kind === "write") return done(fs.writeFileSync(arg, "written by the server"));
      if (kind === "list") return done(null, fs.readdirSync(arg).sort().join(","));
      if (kind === "connect" || kind === "unix") {
        const sock = kind === "connect" ? net.connect({ host: "127.0.0.1", port: arg }) : net.connect({ path: arg });
        const timer = setTimeout(() => { sock.destroy(); done(new Error("timeout")); }, 5000);
        sock.on("connect", () => { clearTimeout(timer); sock.destroy(); done(null); });
        sock.on("error", (e) => { clearTimeout(timer); done(e); });
        return;
      }
      done(new Error("unknown op " + kind));
    } catch (e) {
      done(e);
    }
  });
}

(async () => {
  const results = [];
  for (const op of JSON.parse(process.env.PROBE || "[]")) results.push(await attempt(op));
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", method: "probe", params: { results } }) + "\n");
  let buf = "";
  process.stdin.on("data", (chunk) => {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      let msg;
      try { msg = JSON.parse(line); } catch { continue; }
      if (msg.id === undefined || !msg.method) continue;
      const result = msg.method === "initialize"
        ? { protocolVersion: msg.params?.protocolVersion ?? "2025-06-18", capabilities: {}, serverInfo: { name: "fsbroker-launch-probe", version: "1.0.0" } }
        : {};
      process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: msg.id, result }) + "\n");
    }
  });
})();
