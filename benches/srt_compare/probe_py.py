"""benches/srt_compare.sh's hostile stdio "server" for the Python launch forms (uvx, pipx run, a
virtual environment's python): the operations of probe.js, from $PROBE (a JSON list of
[kind, arg]), reported as one JSON-RPC notification {"method":"probe","params":{"results":[...]}}
("ok", "ok:TEXT", "ok:direct", "ok:proxy" or "err:CODE"); then it answers `initialize` and
`ping` like a server until stdin closes. Packed into a wheel (module fsbroker_launch_probe_py,
program fsbroker-launch-probe-py) by the script and served by its test index only."""
import base64
import errno
import json
import os
import socket
import sys
from urllib.parse import unquote, urlsplit


def err(e):
    if isinstance(e, OSError) and e.errno:
        return "err:" + errno.errorcode.get(e.errno, str(e.errno))
    if isinstance(e, socket.gaierror):
        return "err:EAI"
    return "err:" + type(e).__name__


def direct(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return None
    except Exception as e:  # noqa: BLE001 - every failure is a result
        return err(e)[4:]


def via_proxy(url, target):
    u = urlsplit(url)
    try:
        s = socket.create_connection((u.hostname, u.port or 80), timeout=10)
    except Exception as e:  # noqa: BLE001
        return "proxy-" + err(e)[4:]
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
        return "proxy-" + err(e)[4:]


def tcp(arg):
    host, _, port = arg.rpartition(":")
    d = direct(host, int(port))
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
            with open(arg, encoding="utf-8") as f:
                return "ok:" + f.read()
        if kind == "write":
            with open(arg, "w", encoding="utf-8") as f:
                f.write("written by the server")
            return "ok"
        if kind == "list":
            return "ok:" + ",".join(sorted(os.listdir(arg)))
        if kind == "utime":
            os.utime(arg, (1000000000, 1000000000))
            return "ok"
        if kind == "tcp":
            return tcp(arg)
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(arg)
            s.close()
            return "ok"
        return "err:unknown op " + kind
    except Exception as e:  # noqa: BLE001
        return err(e)


def main():
    results = [attempt(k, a) for k, a in json.loads(os.environ.get("PROBE", "[]"))]
    out = sys.stdout
    out.write(json.dumps({"jsonrpc": "2.0", "method": "probe", "params": {"results": results}}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "id" not in msg or "method" not in msg:
            continue
        result = {}
        if msg["method"] == "initialize":
            result = {
                "protocolVersion": (msg.get("params") or {}).get("protocolVersion", "2025-06-18"),
                "capabilities": {},
                "serverInfo": {"name": "fsbroker-launch-probe-py", "version": "1.0.0"},
            }
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
