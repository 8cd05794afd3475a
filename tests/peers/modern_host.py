"""A host made with the Python SDK (mcp 2.3, `mode="auto"`: MCP 2026-07-28 when the server
speaks it), with roots of its own, runs modern_server.py under `fsbroker proxy`.

`modern_host.py single`: one proxy with a policy. Checks that the server sees the broker's
roots and never the host's (its roots callback is never called), that a policy reload
changes the next answer, and that a confirmation asked together with roots reaches the host
alone.

`modern_host.py shared`: one broker (`fsbroker serve --listen`) and two proxies connected to
it (`proxy --connect`) at once, one host speaking the 2025 era (`mode="legacy"`), one the
2026 era; both servers see the broker's roots, each in its own era.

Env: FSBROKER_BIN, PEERS_TMPDIR (from tests/common/peers.rs). Prints one JSON line."""
import asyncio
import json
import os
import sys
from pathlib import Path

import mcp_types as types
from mcp import Client, StdioServerParameters


def fail(what: str) -> None:
    print(f"PEER TEST FAILED: {what}", file=sys.stderr, flush=True)
    os._exit(1)


BIN = os.environ["FSBROKER_BIN"]
TMP = Path(os.environ["PEERS_TMPDIR"])
SERVER = [sys.executable, str(Path(__file__).with_name("modern_server.py"))]


def write_policy(policy: Path, root: Path, name: str) -> None:
    text = f"[[root]]\npath = '{root}'\nname = \"{name}\"\nmode = \"read-write\"\nconsent = \"auto\"\n"
    new = policy.with_suffix(".new")
    new.write_text(text)
    new.replace(policy)


class Host:
    """The host's callbacks, counted."""

    def __init__(self) -> None:
        self.roots_calls = 0
        self.elicitations = 0

    async def list_roots(self, ctx) -> types.ListRootsResult:
        self.roots_calls += 1
        return types.ListRootsResult(roots=[types.Root(uri="file:///host-only-root", name="host")])

    async def elicit(self, ctx, params) -> types.ElicitResult:
        self.elicitations += 1
        return types.ElicitResult(action="accept", content={"confirm": True})


async def call(client: Client, name: str, args: dict | None = None) -> dict:
    result = await client.call_tool(name, args or {})
    if result.is_error:
        fail(f"{name}: {result.content}")
    return json.loads(result.content[0].text)


async def single() -> dict:
    alpha, beta = TMP / "alpha", TMP / "beta"
    alpha.mkdir()
    beta.mkdir()
    policy = TMP / "policy.toml"
    write_policy(policy, alpha, "alpha")
    host = Host()
    params = StdioServerParameters(command=BIN, args=["proxy", "--policy", str(policy), "--", *SERVER])
    async with Client(params, mode="auto", list_roots_callback=host.list_roots,
                      elicitation_callback=host.elicit) as client:
        version = client.protocol_version
        if version != "2026-07-28":
            fail(f"negotiated {version}")
        first = await call(client, "show_roots")
        if first["roots"] != [alpha.as_uri()]:
            fail(f"show_roots: {first}")
        write_policy(policy, beta, "beta")
        after = first
        for _ in range(100):
            after = await call(client, "show_roots")
            if after["roots"] == [beta.as_uri()]:
                break
            await asyncio.sleep(0.1)
        if after["roots"] != [beta.as_uri()]:
            fail(f"after the reload: {after}")
        both = await call(client, "confirm_and_roots", {"path": str(beta / "x.txt")})
        if both["roots"] != [beta.as_uri()] or both["confirm"] != "accept":
            fail(f"confirm_and_roots: {both}")
    if host.elicitations != 1:
        fail(f"the host saw {host.elicitations} elicitations, not 1")
    if host.roots_calls != 0:
        fail(f"the host's own roots callback was called {host.roots_calls} times")
    return {"version": version, "first": first, "after": after, "both": both,
            "elicitations": host.elicitations, "hostRootsCalls": host.roots_calls}


async def shared() -> dict:
    root = TMP / "shared"
    root.mkdir()
    sock = TMP / "broker.sock"
    broker = await asyncio.create_subprocess_exec(
        BIN, "serve", "--root", str(root), "--listen", str(sock), stdin=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(200):
            if sock.exists():
                break
            await asyncio.sleep(0.05)
        else:
            fail("the shared broker's socket never appeared")

        async def one(mode: str) -> dict:
            host = Host()
            params = StdioServerParameters(command=BIN, args=["proxy", "--connect", str(sock), "--", *SERVER])
            async with Client(params, mode=mode, list_roots_callback=host.list_roots) as client:
                got = []
                for _ in range(5):
                    got.append(await call(client, "roots_any_era"))
                version = client.protocol_version
            if host.roots_calls != 0:
                fail(f"{mode}: the host's own roots callback was called {host.roots_calls} times")
            for g in got:
                if g["roots"] != [root.as_uri()]:
                    fail(f"{mode}: {g}")
            return {"mode": mode, "version": version, "roots": got[0]["roots"]}

        legacy, modern = await asyncio.gather(one("legacy"), one("auto"))
        if legacy["version"] == "2026-07-28" or modern["version"] != "2026-07-28":
            fail(f"eras: {legacy} {modern}")
        return {"legacy": legacy, "modern": modern}
    finally:
        broker.terminate()
        await broker.wait()


async def main() -> None:
    asyncio.get_running_loop().call_later(100, lambda: fail("watchdog: 100 s"))
    which = sys.argv[1]
    result = await (single() if which == "single" else shared())
    import importlib.metadata as md
    print(json.dumps({"ok": True, "test": f"modern_host.py {which}", **result,
                      "versions": {"mcp": md.version("mcp")}}), flush=True)


asyncio.run(main())
