# python tests/rl/mcp_sdk_server.py --port 0 [--stateless] [--json]
"""An MCP tool server built with the official `mcp` Python SDK (PyPI), for
tests/rl/test_mcp_sdk.c: the same few tools on the SDK's streamable HTTP
transport, mcp 2.x (MCPServer) or 1.x (FastMCP), stateful or stateless,
answering with SSE streams (the SDK's default) or JSON bodies (--json).

Tools:
  echo(text: str) -> str          the text as received (shows what the
                                   server decoded, e.g. U+FFFD)
  add(a: int, b: int) -> int      two required arguments, validated by
                                   pydantic (a bad one is an isError result)
  fail(text: str) -> str          raises ToolError("cannot fail on <text>"), the
                                   SDK's way to give the caller the text

The first stdout line is "PORT <n>"; `--version` prints the SDK's major
version and exits (3 when the package is missing).
"""
import argparse
import logging
import socket
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--stateless", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--version", action="store_true")
    args = ap.parse_args()
    try:
        import importlib.metadata

        version = importlib.metadata.version("mcp")
        import uvicorn
    except Exception:  # the package (or its server extras) is not installed
        print("no mcp package", file=sys.stderr)
        sys.exit(3)
    major = int(version.split(".")[0])
    if args.version:
        print(major)
        return

    # Listen and announce the port before the SDK's slow imports: a client
    # that comes early waits in the listen queue.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    # The reader of stdout goes away after the port: nothing more is printed.
    sys.stdout = open("/dev/null", "w")

    if major >= 2:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError

        server = MCPServer("manta-test")
    else:
        from mcp.server.fastmcp import FastMCP
        from mcp.server.fastmcp.exceptions import ToolError

        server = FastMCP(
            "manta-test", stateless_http=args.stateless, json_response=args.json, log_level="WARNING"
        )

    @server.tool()
    def echo(text: str) -> str:
        """Returns the text as received."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """a + b"""
        return a + b

    @server.tool()
    def fail(text: str) -> str:
        """Always fails."""
        raise ToolError(f"cannot fail on {text}")

    if major >= 2:
        app = server.streamable_http_app(stateless_http=args.stateless, json_response=args.json)
    else:
        app = server.streamable_http_app()

    # The SDK logs every session, and `fail` as an error: quiet.
    logging.disable(logging.ERROR)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
