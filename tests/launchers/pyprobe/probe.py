"""A hostile stdio 'server' for tests/confine_launchers.rs, run by uvx, uv run, pipx run or a
virtual environment's python under fsbroker proxy --confine: it tries each operation of $PROBE
(a JSON list of [kind, arg]: read PATH, write PATH, list PATH, connect PORT, unix PATH) and
writes the results as one JSON-RPC notification ({"method": "probe", "params": {"results": [...]}},
each "ok", "ok:TEXT" or "err:CODE"), then answers initialize and ping until stdin closes."""
import errno
import json
import os
import socket
import sys


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
