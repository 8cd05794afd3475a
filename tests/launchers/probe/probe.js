#!/usr/bin/env node
// The hostile stdio "server" of tests/confine_launchers.rs and benches/srt_compare.sh (the npm
// package fsbroker-launch-probe, served only by their own registries): started by a launch form
// under a sandbox, it tries each operation of $PROBE (a JSON list of [kind, arg]) and writes the
// results as one JSON-RPC notification, {"method":"probe","params":{"results":[...]}}: "ok",
// "ok:TEXT" or "err:CODE". Then it answers `initialize` and `ping` like a server until stdin
// closes. The operations are in the environment, not the arguments: a path named on a server's
// command line is granted to it.
//
// Kinds:
//   read PATH       the file's contents, "ok:TEXT"
//   write PATH      create or truncate the file
//   list PATH       the directory's names, "ok:A,B,..."
//   connect PORT    a TCP connection to 127.0.0.1:PORT
//   unix PATH       a connection to a Unix socket
//   utime PATH      set the file's access and modification times (metadata, no contents)
//   tcp HOST:PORT   a TCP connection to HOST:PORT, first directly, then, if that fails and the
//                   environment names an HTTP proxy (as srt's sandbox does: it has no other
//                   way out), through the proxy's CONNECT: "ok:direct", "ok:proxy", or
//                   "err:DIRECT_CODE;proxy:STATUS".
"use strict";
const fs = require("node:fs");
const net = require("node:net");

// null if HOST:PORT accepts a connection, else why not.
function direct(host, port) {
  return new Promise((resolve) => {
    const sock = net.connect({ host, port: Number(port) });
    const timer = setTimeout(() => { sock.destroy(); resolve("timeout"); }, 5000);
    sock.on("connect", () => { clearTimeout(timer); sock.destroy(); resolve(null); });
    sock.on("error", (e) => { clearTimeout(timer); resolve(e.code || e.message); });
  });
}

function proxyUrl() {
  for (const v of ["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]) {
    const u = process.env[v];
    if (u && u.startsWith("http://")) return new URL(u);
  }
  return null;
}

// null if the proxy's CONNECT to TARGET answered 200, else its status or why it failed.
function viaProxy(proxy, target) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: proxy.hostname, port: Number(proxy.port || 80) });
    const timer = setTimeout(() => { sock.destroy(); resolve("timeout"); }, 10000);
    let buf = "";
    sock.on("connect", () => {
      let head = `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n`;
      if (proxy.username) {
        const cred = decodeURIComponent(proxy.username) + ":" + decodeURIComponent(proxy.password);
        head += `Proxy-Authorization: Basic ${Buffer.from(cred).toString("base64")}\r\n`;
      }
      sock.write(head + "\r\n");
    });
    sock.on("data", (d) => {
      buf += d.toString("latin1");
      const nl = buf.indexOf("\r\n");
      if (nl < 0) return;
      clearTimeout(timer);
      sock.destroy();
      const status = buf.slice(0, nl).split(" ")[1];
      resolve(status === "200" ? null : status);
    });
    sock.on("error", (e) => { clearTimeout(timer); resolve("proxy-" + (e.code || e.message)); });
  });
}

async function tcp(arg) {
  const at = arg.lastIndexOf(":");
  const [host, port] = [arg.slice(0, at), arg.slice(at + 1)];
  const d = await direct(host, port);
  if (d === null) return "ok:direct";
  const proxy = proxyUrl();
  if (!proxy) return "err:" + d;
  const p = await viaProxy(proxy, arg);
  return p === null ? "ok:proxy" : `err:${d};proxy:${p}`;
}

function attempt(op) {
  const [kind, arg] = op;
  return new Promise((resolve) => {
    const done = (e, text) => resolve(e ? "err:" + (e.code || e.message) : text === undefined ? "ok" : "ok:" + text);
    try {
      if (kind === "read") return done(null, fs.readFileSync(arg, "utf8"));
      if (kind === "write") return done(fs.writeFileSync(arg, "written by the server"));
      if (kind === "list") return done(null, fs.readdirSync(arg).sort().join(","));
      if (kind === "utime") return done(fs.utimesSync(arg, 1000000000, 1000000000));
      if (kind === "tcp") return tcp(arg).then(resolve, done);
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
