"""An MCP 2026-07-28 server made with the Python SDK (mcp 2.3). Its tools ask the client for
roots the new way (an input_required result), for roots and a confirmation at once, and for
roots in whichever era the connection speaks (Resolve). Run under `fsbroker proxy`."""
import json
from typing import Annotated

from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp_types import (ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult,
                       ListRootsRequest, ListRootsResult)

mcp = MCPServer("modern-py-server")


def uris(result: ListRootsResult) -> list[str]:
    return [str(r.uri) for r in result.roots]


@mcp.tool()
async def show_roots(ctx: Context) -> InputRequiredResult | str:
    """Roots through input_required (2026-07-28 only)."""
    got = (ctx.input_responses or {}).get("roots")
    if not isinstance(got, ListRootsResult):
        return InputRequiredResult(input_requests={"roots": ListRootsRequest()})
    return json.dumps({"era": ctx.protocol_version, "roots": uris(got)})


@mcp.tool()
async def confirm_and_roots(path: str, ctx: Context) -> InputRequiredResult | str:
    """A confirmation (the host's to give) and roots (the broker's) in one input_required."""
    got = ctx.input_responses or {}
    confirm, roots = got.get("confirm"), got.get("roots")
    if not (isinstance(confirm, ElicitResult) and isinstance(roots, ListRootsResult)):
        return InputRequiredResult(
            input_requests={
                "confirm": ElicitRequest(params=ElicitRequestFormParams(
                    message=f"Really touch {path}?",
                    requested_schema={"type": "object", "properties": {"confirm": {"type": "boolean"}},
                                      "required": ["confirm"]})),
                "roots": ListRootsRequest(),
            },
            request_state="py-round-1",
        )
    return json.dumps({"confirm": confirm.action, "roots": uris(roots), "state": ctx.request_state})


async def get_roots() -> ListRoots:
    return ListRoots()


@mcp.tool()
async def roots_any_era(roots: Annotated[ListRootsResult, Resolve(get_roots)]) -> str:
    """Roots in either era: input_required on 2026-07-28, a roots/list request on 2025."""
    return json.dumps({"roots": uris(roots)})


if __name__ == "__main__":
    mcp.run()
