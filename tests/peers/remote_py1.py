"""A remote MCP server (2025 era) made with the Python SDK 1.x (mcp 1.30, FastMCP): stateful
Streamable HTTP (session ids), SSE responses, an event store so that a dropped stream can be
resumed with Last-Event-ID. Its tools send roots/list and files/* requests to the client.
Interface: README.md, "Remote servers". Runs in tests/peers/.venv-mcp1 (requirements-mcp1.txt).

    python remote_py1.py [--tls CERT KEY] [--require-header NAME:VALUE] [--drop-sse-after N]
                         [--body-limit BYTES]   (default: the SDK's own limit, 4 MiB)
"""
import argparse
import asyncio
import base64
import hashlib
import json
import os
import socket
import sys
import threading
from datetime import timedelta
from typing import Any

import mcp.types as types
import uvicorn
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.session import ServerSession
from mcp.server.streamable_http import EventMessage, EventStore
from mcp.shared.exceptions import McpError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ConfigDict

NAME = "remote_py1"


def say(text: str) -> None:
    sys.stderr.write(f"[{NAME}] {text}\n")
    sys.stderr.flush()


def header(value: str) -> tuple[str, str]:
    name, sep, rest = value.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("NAME:VALUE")
    return name.strip().lower(), rest.strip()


parser = argparse.ArgumentParser(prog=NAME)
parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
parser.add_argument("--require-header", type=header)
parser.add_argument("--drop-sse-after", type=int, default=0)
parser.add_argument("--body-limit", type=int)
opts = parser.parse_args()


class Anything(BaseModel):
    """Any request or result: the SDK only knows its own methods, the broker's are ours."""
    model_config = ConfigDict(extra="allow")


class Request(BaseModel):
    method: str
    params: dict[str, Any] | None = None


class Store(EventStore):
    """Events in arrival order; a resume replays the rest of the stream its id names.
    Priming events (no message) are stored so their ids resolve, but carry nothing to replay."""

    def __init__(self) -> None:
        self.events: dict[str, tuple[str, types.JSONRPCMessage | None]] = {}
        self.next = 0

    async def store_event(self, stream_id, message):
        self.next += 1
        event_id = f"{stream_id}_{self.next}"
        self.events[event_id] = (stream_id, message)
        return event_id

    async def replay_events_after(self, last_event_id, send_callback):
        if last_event_id not in self.events:
            return None
        stream = self.events[last_event_id][0]
        after = False
        for event_id, (sid, message) in list(self.events.items()):
            if event_id == last_event_id:
                after = True
            elif after and sid == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


kwargs: dict[str, Any] = {}
if opts.body_limit:
    kwargs["max_request_body_size"] = opts.body_limit
mcp = FastMCP("fsbroker-remote-py1", event_store=Store(), json_response=False, stateless_http=False, **kwargs)

deleted_sessions: list[str] = []
expired_sessions: list[str] = []
get_streams: list[dict[str, Any]] = []
drops = 0
drops_by_session: dict[str, int] = {}
early: dict[int, asyncio.Task] = {}  # ServerSession (by id()) → its early roots/list


async def ask(session: ServerSession, method: str, params: dict | None, related=None, timeout=None) -> dict:
    """A request to the client; a JSON-RPC error comes back as data, not as a raise."""
    metadata = ServerMessageMetadata(related_request_id=related) if related is not None else None
    try:
        r = await session.send_request(Request(method=method, params=params), Anything,  # type: ignore[arg-type]
                                       request_read_timeout_seconds=timeout, metadata=metadata)
        return {"result": r.model_dump(by_alias=True, exclude_none=True)}
    except McpError as e:
        return {"error": {"code": e.error.code, "message": e.error.message, "data": e.error.data}}


# The SDK offers no hook on notifications/initialized: wrap the session's handling of it, and
# send roots/list from there, on the GET stream, as a server that wants roots at once does.
_received = ServerSession._received_notification


async def _on_notification(self: ServerSession, notification: types.ClientNotification) -> None:
    await _received(self, notification)
    if isinstance(notification.root, types.InitializedNotification):
        # A task: answering it needs this very receive loop to go on.
        early[id(self)] = asyncio.create_task(ask(self, "roots/list", None, timeout=timedelta(seconds=15)))


ServerSession._received_notification = _on_notification  # type: ignore[method-assign]


def related(ctx: Context, stream: str | None):
    """On the tool call's own POST stream, or (no related request) on the GET stream."""
    return None if stream == "get" else ctx.request_id


def session_id(ctx: Context) -> str | None:
    request = ctx.request_context.request
    return request.headers.get("mcp-session-id") if request is not None else None


@mcp.tool()
async def request(method: str, ctx: Context, params: dict[str, Any] | None = None, stream: str | None = None) -> str:
    """Any request to the client: {result} or {error}."""
    return json.dumps(await ask(ctx.session, method, params, related(ctx, stream)))


@mcp.tool()
async def read_all(path: str, chunk: int, ctx: Context, stream: str | None = None) -> str:
    """The whole file through files/read chunks of `chunk` bytes: {bytes, sha256, reads, errors}."""
    digest = hashlib.sha256()
    out: dict[str, Any] = {"bytes": 0, "sha256": "", "reads": 0, "clamped": 0, "errors": []}
    offset = 0
    while True:
        r = await ask(ctx.session, "files/read", {"path": path, "offset": offset, "length": chunk, "encoding": "base64"},
                      related(ctx, stream))
        out["reads"] += 1
        if "error" in r:
            out["errors"].append({"offset": offset, **r["error"]})
            break
        a = r["result"]
        data = base64.b64decode(a["content"]) if a.get("encoding") == "base64" else a["content"].encode()
        if len(data) != a["length"]:
            out["errors"].append({"offset": offset, "message": f"decoded {len(data)} bytes, answer says {a['length']}"})
        digest.update(data)
        offset += a["length"]
        if a["length"] < chunk and not a["eof"]:
            out["clamped"] += 1
        if a["eof"]:
            break
        if a["length"] == 0:
            out["errors"].append({"offset": offset, "message": "empty chunk before eof"})
            break
    out["bytes"] = offset
    out["sha256"] = digest.hexdigest()
    return json.dumps(out)


@mcp.tool()
async def early_roots(ctx: Context) -> str:
    """The answer to the roots/list sent when the session was initialized."""
    task = early.get(id(ctx.session))
    if task is None:
        return json.dumps({"error": {"message": "no initialized notification seen"}})
    return json.dumps(await task)


@mcp.tool()
async def expire_session(ctx: Context) -> str:
    """Forgets this session: the client's next request with its id gets 404."""
    sid = session_id(ctx)
    manager = mcp.session_manager
    transport = manager._server_instances.pop(sid, None)  # this answer still goes out on it
    expired_sessions.append(sid)
    say(f"expired session {sid}")
    if transport is not None:
        async def later():
            await asyncio.sleep(2)
            await transport.terminate()
        asyncio.get_running_loop().create_task(later())
    return json.dumps({"expired": sid})


@mcp.tool()
async def sse_count(ctx: Context) -> str:
    """The GET streams of this session (their Last-Event-ID) and how many streams were cut."""
    sid = session_id(ctx)
    return json.dumps({"gets": [g["lastEventId"] for g in get_streams if g["session"] == sid],
                       "drops": drops_by_session.get(sid, 0)})


inner = mcp.streamable_http_app()
base = ""
METADATA = "/.well-known/oauth-protected-resource"


async def respond(send, status: int, body: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


async def app(scope, receive, send):
    """The SDK's app behind the test interface: metadata, /debug, the header gate, the record
    of GETs and DELETEs, and --drop-sse-after."""
    global drops
    if scope["type"] != "http":
        return await inner(scope, receive, send)
    path, method = scope["path"], scope["method"]
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    if method == "GET" and path.startswith(METADATA):
        # RFC 9728 protected resource metadata; no authorization server really exists.
        return await respond(send, 200, {"resource": f"{base}/mcp", "authorization_servers": [f"{base}/"],
                                         "bearer_methods_supported": ["header"], "resource_name": NAME})
    if method == "GET" and path == "/debug":
        return await respond(send, 200, {"sessions": list(mcp.session_manager._server_instances),
                                         "deleted_sessions": deleted_sessions, "expired_sessions": expired_sessions,
                                         "get_streams": get_streams, "drops": drops})
    if path != "/mcp":
        return await respond(send, 404, {"error": "not found"})
    # Only the MCP endpoint is protected, as a resource server does: OAuth discovery probes
    # elsewhere get 404, and no authorization server is offered.
    if opts.require_header and headers.get(opts.require_header[0]) != opts.require_header[1]:
        say(f"401 for {method} {path}: header {opts.require_header[0]} missing or wrong")
        return await respond(send, 401, {"error": "unauthorized"},
                             [(b"www-authenticate", f'Bearer resource_metadata="{base}{METADATA}"'.encode())])
    sid = headers.get("mcp-session-id")
    if method == "GET" and path == "/mcp":
        get_streams.append({"session": sid, "lastEventId": headers.get("last-event-id")})
    status = {}

    async def record(message):
        if message["type"] == "http.response.start":
            status["code"] = message["status"]
        await send(message)

    out = record
    if opts.drop_sse_after:
        events = 0
        cut = False

        async def dropping(message):
            nonlocal events, cut
            global drops
            if cut:
                return
            await record(message)
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if body[:6] in (b"event:", b"id: ", b"data: ", b"retry:") or body.startswith((b"id:", b"data:")):
                events += body.count(b"\r\n\r\n") + body.count(b"\n\n")
                if events >= opts.drop_sse_after:
                    cut = True
                    drops += 1
                    if sid:
                        drops_by_session[sid] = drops_by_session.get(sid, 0) + 1
                    say(f"dropping the SSE stream of {method} after {opts.drop_sse_after} events")
                    # uvicorn's own send is a method of the request's cycle, which holds the
                    # connection: closing it mid-body is the dropped connection a client sees.
                    send.__self__.transport.close()

        out = dropping
    await inner(scope, receive, out)
    if method == "DELETE" and sid and status.get("code", 500) < 300:
        deleted_sessions.append(sid)
        say(f"deleted session {sid}")


async def main() -> None:
    global base
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    scheme = "https" if opts.tls else "http"
    base = f"{scheme}://127.0.0.1:{port}"
    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            ssl_certfile=opts.tls[0] if opts.tls else None,
                            ssl_keyfile=opts.tls[1] if opts.tls else None)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving
            return
        await asyncio.sleep(0.02)
    print(json.dumps({"url": f"{base}/mcp"}), flush=True)
    say(f"listening on {base}/mcp")
    await serving


def watch_stdin() -> None:
    # The test holds our stdin: when it goes away (or the test dies) so do we.
    while sys.stdin.buffer.read(65536):
        pass
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=watch_stdin, daemon=True).start()
    asyncio.run(main())
