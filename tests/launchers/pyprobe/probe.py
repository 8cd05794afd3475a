"""The hostile stdio 'server' of tests/confine_launchers.rs and benches/srt_compare.sh for the
Python launch forms (uvx, uv run, pipx run, a virtual environment's python or program), packed
into the wheel fsbroker-launch-probe by build_wheel.py and served only by their own indexes.
Started under a sandbox, it tries each operation of $PROBE (a JSON list of [kind, arg]; in the
environment, as a path named on a server's command line is granted to it) and writes the results
as one JSON-RPC notification ({"method": "probe", "params": {"results": [...]}}, each "ok",
"ok:TEXT" or "err:CODE"), then answers initialize and ping until stdin closes.

Kinds, as the npm probe's (tests/launchers/probe/probe.js):
  read PATH       the file's contents, "ok:TEXT"
  write PATH      create or truncate the file
  list PATH       the directory's names, "ok:A,B,..."
  connect PORT    a TCP connection to 127.0.0.1:PORT
  unix PATH       a connection to a Unix socket
  utime PATH      set the file's access and modification times (metadata, no contents)
  tcp HOST:PORT   a TCP connection to HOST:PORT, first directly, then, if that fails and the
                  environment names an HTTP proxy (as srt's sandbox does: it has no other way
                  out), through the proxy's CONNECT: "ok:direct", "ok:proxy", or
                  "err:DIRECT_CODE;proxy:STATUS"."""
import base64
import errno
import json
import os
import socket
import sys
from urllib.parse import unquote, urlsplit


def code(e):
    """An exception's code: its errno's name, EAI for a name that did not resolve, else its type."""
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno))
    if isinstance(e, socket.gaierror):
        return "EAI"
    return type(e).__name__


def direct(host, port):
    """None if HOST:PORT accepts a connection, else why not."""
    try:
        socket.create_connection((host, port), timeout=5).close()
        return None
    except Exception as e:  # noqa: BLE001 - every failure is a result
        return code(e)


def via_proxy(url, target):
    """None if the proxy's CONNECT to TARGET answered 200, else its status or why it failed."""
    u = urlsplit(url)
    try:
        s = socket.create_connection((u.hostname, u.port or 80), timeout=10)
    except Exception as e:  # noqa: BLE001
        return "proxy-" + code(e)
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if u.username is not None:
        cred = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
        head += f"Proxy-Authorization: Basic {base64.b64encode(cred).decode()}\r\n"
    try:
        s.sendall((head + "\r\n").encode())
        line = s.recv(512).split(b"\r\n", 1)[0].decode("latin1")
        s.close()
        status = line.split(" ")[1] if " " in line else "???"
        return None if status == "200" else status
    except Exception as e:  # noqa: BLE001
        return "proxy-" + code(e)


def tcp(arg):
    try:
        host, _, port = arg.rpartition(":")
        d = direct(host, int(port))
    except Exception as e:  # noqa: BLE001 - a malformed HOST:PORT
        return "err:" + code(e)
    if d is None:
        return "ok:direct"
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        url = os.environ.get(name, "")
        if url.startswith("http://"):
            p = via_proxy(url, arg)
            return "ok:proxy" if p is None else f"err:{d};proxy:{p}"
    return "err:" + d


def attempt(kind, arg):
    try:
        if kind == "read":
            with open(arg) as f:
                return "ok:" + f.read()
        if kind == "write":
            with open(arg, "w") as f:
                f.write("written by the server")
            return "ok"
        if kind == "list":
            return "ok:" + ",".join(sorted(os.listdir(arg)))
        if kind == "connect":
            socket.create_connection(("127.0.0.1", arg), timeout=5).close()
            return "ok"
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(arg)
            s.close()
            return "ok"
        if kind == "utime":
            os.utime(arg, (1000000000, 1000000000))
            return "ok"
        if kind == "tcp":
            return tcp(arg)
        return "err:unknown op"
    except OSError as e:
        return "err:" + errno.errorcode.get(e.errno, str(e.errno))


def main():
    results = [attempt(*op) for op in json.loads(os.environ.get("PROBE", "[]"))]
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "probe", "params": {"results": results}}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "id" not in msg or "method" not in msg:
            continue
        result = {}
        if msg["method"] == "initialize":
            result = {"protocolVersion": msg.get("params", {}).get("protocolVersion", "2025-06-18"),
                      "capabilities": {}, "serverInfo": {"name": "fsbroker-launch-probe", "version": "1.0.0"}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
