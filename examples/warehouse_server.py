# python3 examples/warehouse_server.py --port 8001
"""warehouse_server: an MCP tool server over streamable HTTP, standard
library only, for the second example task (examples/warehouse_agent.yaml).

A warehouse where nothing can be guessed: an item's stock-keeping unit and a
unit's shelf are keyed hashes, so the answer to "where is ab417?" takes two
tool calls, the second one's argument copied from the first one's answer:

  sku {item: string}    item code, two lowercase letters and three digits
                        ("ab417") -> its SKU, four characters of
                        ABCDEFGHJKLMNPQRSTUVWXYZ23456789 ("QX7M")
  shelf {sku: string}   a SKU -> its shelf, aisle letter, rack digit, bin
                        ("C4-19")

A malformed argument answers isError: true with the reason, as MCP tools
do; an unknown tool is a JSON-RPC error -32602.

Endpoints: POST /mcp (JSON-RPC 2.0: initialize with an Mcp-Session-Id
header, notifications -> 202, ping, tools/list, tools/call), DELETE /mcp
(ends a session), GET /health.

Options:
  --port N     0 picks a free port; the first stdout line is "PORT N"
  --host H     default 127.0.0.1
  --verbose    log each request to stderr

The functions sku() and shelf() are the task's ground truth:
examples/warehouse/gen.py imports them to write the data.
"""
import argparse
import hashlib
import json
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MAX_REQUEST = 1 << 20  # bytes of one JSON-RPC message
SKU_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no I, O, 0, 1
ITEM = re.compile(r"[a-z]{2}[0-9]{3}")
SKU = re.compile("[%s]{4}" % SKU_ALPHABET)

TOOLS = [
    {
        "name": "sku",
        "description": "The stock-keeping unit of an item code (two letters, three digits).",
        "inputSchema": {
            "type": "object",
            "properties": {"item": {"type": "string", "description": "item code, e.g. ab417"}},
            "required": ["item"],
        },
    },
    {
        "name": "shelf",
        "description": "The shelf (aisle, rack, bin) where a stock-keeping unit is stored.",
        "inputSchema": {
            "type": "object",
            "properties": {"sku": {"type": "string", "description": "a SKU, e.g. QX7M"}},
            "required": ["sku"],
        },
    },
]


def _digest(kind, key):
    return hashlib.sha256(("warehouse/%s/%s" % (kind, key)).encode()).digest()


def sku(item):
    """The SKU of a valid item code."""
    d = _digest("sku", item)
    return "".join(SKU_ALPHABET[b % len(SKU_ALPHABET)] for b in d[:4])


def shelf(unit):
    """The shelf of a valid SKU: aisle A-H, rack 1-9, bin 01-40."""
    d = _digest("shelf", unit)
    return "%s%d-%02d" % ("ABCDEFGH"[d[0] % 8], 1 + d[1] % 9, 1 + d[2] % 40)


def call_tool(name, args):
    """(text, is_error) of a tools/call, or None for an unknown tool."""
    if name == "sku":
        item = args.get("item")
        if not isinstance(item, str) or not ITEM.fullmatch(item):
            return "unknown item %r: item codes are two letters and three digits" % (item,), True
        return sku(item), False
    if name == "shelf":
        unit = args.get("sku")
        if not isinstance(unit, str) or not SKU.fullmatch(unit):
            return "unknown sku %r: SKUs are four characters of %s" % (unit, SKU_ALPHABET), True
        return shelf(unit), False
    return None


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so clients reuse connections
        server_version = "warehouse_server/1"

        def log_message(self, fmt, *a):
            if state["verbose"]:
                sys.stderr.write("warehouse_server: %s\n" % (fmt % a))

        def _send(self, code, body=b"", headers=None):
            if isinstance(body, str):
                body = body.encode()
            self.send_response(code)
            if body:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _result(self, rid, result, headers=None):
            self._send(200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}), headers)

        def _error(self, http, rid, code, message):
            body = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
            self._send(http, json.dumps(body))

        def do_GET(self):
            if self.path.split("?")[0] == "/health":
                self._send(200, json.dumps({"status": "healthy"}))
            elif self.path.split("?")[0] == "/mcp":
                self._send(405, "", headers={"Allow": "POST, DELETE"})  # no server stream
            else:
                self._send(404, json.dumps({"error": "not found"}))

        def do_DELETE(self):
            sid = self.headers.get("Mcp-Session-Id")
            with state["lock"]:
                known = sid in state["sessions"]
                state["sessions"].discard(sid)
            self._send(200 if known else 404)

        def do_POST(self):
            try:
                self._post()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _post(self):
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if n < 0 or n > MAX_REQUEST:
                self.close_connection = True
                self._error(413 if n > 0 else 400, None, -32600, "bad Content-Length")
                return
            raw = self.rfile.read(n) if n > 0 else b""
            if self.path.split("?")[0] != "/mcp":
                self._send(404, json.dumps({"error": "not found"}))
                return
            try:
                msg = json.loads(raw)
            except ValueError:
                self._error(400, None, -32700, "parse error")
                return
            if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
                self._error(400, None, -32600, "invalid request")
                return
            method, rid = msg.get("method"), msg.get("id")
            if method is None or rid is None:  # a response or a notification
                self._send(202)
                return
            if method != "initialize":
                with state["lock"]:
                    known = self.headers.get("Mcp-Session-Id") in state["sessions"]
                if not known:
                    self._error(404, rid, -32001, "session not found")
                    return
            params = msg.get("params") or {}
            if not isinstance(params, dict):
                self._error(200, rid, -32602, "params must be an object")
            elif method == "initialize":
                asked = params.get("protocolVersion")
                sid = uuid.uuid4().hex
                with state["lock"]:
                    state["sessions"].add(sid)
                self._result(rid, {
                    "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "warehouse_server", "version": "1.0.0"},
                }, headers={"Mcp-Session-Id": sid})
            elif method == "ping":
                self._result(rid, {})
            elif method == "tools/list":
                self._result(rid, {"tools": TOOLS})
            elif method == "tools/call":
                args = params.get("arguments") or {}
                out = call_tool(params.get("name"), args if isinstance(args, dict) else {})
                if out is None:
                    self._error(200, rid, -32602, "unknown tool: %s" % (params.get("name"),))
                else:
                    self._result(rid, {"content": [{"type": "text", "text": out[0]}],
                                       "isError": out[1]})
            else:
                self._error(200, rid, -32601, "method not found: %s" % method)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the env actors open many connections at once
    allow_reuse_address = True


def main(argv=None):
    ap = argparse.ArgumentParser(description="MCP warehouse server (streamable HTTP)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    state = {"verbose": args.verbose, "lock": threading.Lock(), "sessions": set()}
    srv = Server((args.host, args.port), make_handler(state))
    print("PORT %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
