"""Servers for benches/srt_compare.sh, which runs them on its own test host (a network namespace
it makes) and on loopback; each runs until killed.

  serve.py registry DIR HOST PORT LOG   an npm registry and a PEP 503 package index on
      HOST:PORT serving DIR's *.tgz (npm packs, by their package.json) and *.whl: GET /NAME
      (or /@SCOPE%2fNAME) a packument, /tarballs/FILE the bytes, /simple/NAME/ the links,
      /files/FILE the wheel; every request's path is appended to LOG.
  serve.py listen PORTFILE TCPHOST:TCPPORT [UNIX_PATH...]   accepts TCP on TCPHOST:TCPPORT
      (port 0: the system's choice, written to PORTFILE) and on each Unix socket path, and
      closes each connection at once (a service, an ssh-agent: only whether one connects
      counts).
"""
import base64
import hashlib
import http.server
import io
import json
import os
import re
import socket
import sys
import tarfile
import threading


def registry(directory, host, port, log):
    packuments, blobs, wheels = {}, {}, {}
    base = f"http://{host}:{port}"
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        data = open(path, "rb").read()
        if name.endswith(".tgz"):
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                member = next(m for m in t.getmembers() if re.fullmatch(r"[^/]+/package\.json", m.name))
                manifest = json.load(t.extractfile(member))
            entry = {k: manifest[k] for k in ("name", "version", "dependencies", "bin", "engines") if k in manifest}
            if isinstance(entry.get("bin"), str):
                entry["bin"] = {manifest["name"].split("/")[-1]: entry["bin"]}
            entry["dist"] = {
                "tarball": f"{base}/tarballs/{name}",
                "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
                "shasum": hashlib.sha1(data).hexdigest(),
            }
            p = packuments.setdefault(manifest["name"], {"name": manifest["name"], "dist-tags": {}, "versions": {}})
            p["versions"][manifest["version"]] = entry
            p["dist-tags"]["latest"] = manifest["version"]
            blobs["/tarballs/" + name] = data
        elif name.endswith(".whl"):
            project = re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()
            wheels.setdefault(project, []).append((name, hashlib.sha256(data).hexdigest()))
            blobs["/files/" + name] = data

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, status, kind, body):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            with open(log, "a") as f:
                f.write(self.path + "\n")
            path = self.path.split("?")[0]
            if path in blobs:
                return self.send(200, "application/octet-stream", blobs[path])
            if path.startswith("/simple/"):
                project = re.sub(r"[-_.]+", "-", path[len("/simple/"):].strip("/")).lower()
                if project in wheels:
                    links = "".join(f'<a href="/files/{n}#sha256={h}">{n}</a><br/>\n' for n, h in wheels[project])
                    html = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"
                    return self.send(200, "text/html", html.encode())
            name = path.lstrip("/").replace("%2f", "/").replace("%2F", "/").replace("%40", "@")
            if name in packuments:
                return self.send(200, "application/json", json.dumps(packuments[name]).encode())
            self.send(404, "application/json", b'{"error":"not found"}')

        do_HEAD = do_GET

    http.server.ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


def accept_forever(sock):
    while True:
        conn, _ = sock.accept()
        conn.close()


def listen(portfile, tcp, unix_paths):
    host, _, port = tcp.rpartition(":")
    threads = []
    s = socket.create_server((host, int(port)))
    with open(portfile + ".tmp", "w") as f:
        f.write(str(s.getsockname()[1]))
    threads.append(threading.Thread(target=accept_forever, args=(s,), daemon=True))
    for path in unix_paths:
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        u.bind(path)
        u.listen(16)
        threads.append(threading.Thread(target=accept_forever, args=(u,), daemon=True))
    for t in threads:
        t.start()
    os.rename(portfile + ".tmp", portfile)
    threading.Event().wait()


if __name__ == "__main__":
    if sys.argv[1] == "registry":
        registry(*sys.argv[2:6])
    elif sys.argv[1] == "listen":
        listen(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
