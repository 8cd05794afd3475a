"""Starts one launch form as an MCP host would and says what came of it (benches/srt_compare.sh).

  driver.py OUT.jsonl SANDBOX FORM KIND TIMEOUT -- COMMAND...

Starts COMMAND (in its own process group, in the current directory and environment), sends
`initialize` at once, and reads its stdout until the probe's notification ("probe") and, for a
server that answers, the answer to `initialize` have come, or it exits, or TIMEOUT seconds pass;
then closes its stdin, waits up to 15 s, and ends the group. KIND: "probe" (a probe that
answers initialize), "cprobe" (the compiled probe, which only reports), "server" (a real MCP
server: only the answer counts). Appends one JSON line to OUT.jsonl: started (the probe
reported, or the server answered), results, seconds to the probe's line and to the answer,
exit status, and the end of stderr.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time


def main():
    out, sandbox, form, kind, timeout = sys.argv[1:6]
    assert sys.argv[6] == "--"
    argv = sys.argv[7:]
    timeout = float(timeout)
    start = time.monotonic()
    stderr_path = out + f".{sandbox}.{form}.stderr"
    with open(stderr_path, "wb") as err:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                             start_new_session=True)
    got = {"probe": None, "init": None, "t_probe": None, "t_init": None}
    done = threading.Event()

    def need():
        if kind == "cprobe":
            return got["probe"] is None
        if kind == "server":
            return got["init"] is None
        return got["probe"] is None or got["init"] is None

    def reader():
        for line in p.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            now = round(time.monotonic() - start, 3)
            if msg.get("method") == "probe" and got["probe"] is None:
                got["probe"], got["t_probe"] = msg["params"]["results"], now
            elif msg.get("id") == 1 and got["init"] is None:
                got["init"], got["t_init"] = msg, now
            if not need():
                break
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "srt_compare", "version": "1"}}}
    try:
        p.stdin.write((json.dumps(init) + "\n").encode())
        p.stdin.flush()
    except OSError:
        pass
    done.wait(timeout)
    timed_out = not done.is_set()
    try:
        p.stdin.close()
    except OSError:
        pass
    try:
        rc = p.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if rc is None:
        rc = p.wait()
    answer = got["init"] or {}
    started = got["probe"] is not None if kind != "server" else "result" in answer
    tail = open(stderr_path, "rb").read()[-1500:].decode("utf-8", "replace")
    record = {
        "sandbox": sandbox, "form": form, "kind": kind, "started": started,
        "results": got["probe"], "answered": "result" in answer,
        "server": (answer.get("result") or {}).get("serverInfo", {}).get("name"),
        "error": answer.get("error"), "t_probe": got["t_probe"], "t_init": got["t_init"],
        "timed_out": timed_out, "rc": rc, "stderr_tail": tail,
    }
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"  {sandbox:9} {form:14} started={started} t={got['t_init'] or got['t_probe']} "
          f"results={got['probe']}", flush=True)


if __name__ == "__main__":
    main()
