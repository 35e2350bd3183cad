# python3 examples/calc_server.py --port 8000 [--latency-ms 50 --latency-dist lognormal] [--sse] [--fail-rate 0.1]
"""calc_server: an MCP tool server over streamable HTTP, standard library only.

It serves one MCP endpoint, POST /mcp, speaking JSON-RPC 2.0:

  initialize                 -> protocolVersion, capabilities {tools: {}},
                                serverInfo, and an Mcp-Session-Id header
  notifications/initialized  -> 202 Accepted (any notification does)
  tools/list                 -> the tools below
  tools/call                 -> {content: [{type: "text", text}], isError}

Tools:
  calc {expression: string}  arithmetic on integers and decimals:
                             + - * / // % ** parentheses, unary minus/plus.
                             Parsed with `ast` and evaluated by walking only
                             those nodes, so nothing else can run. Big
                             integers are exact. Division by zero, overflow
                             and malformed input give isError: true.
  add {a: number, b: number} a + b
  mul {a: number, b: number} a * b

Also GET /health -> {"status": "healthy"}; DELETE /mcp ends a session.

Options:
  --port N            0 picks a free port; the first stdout line is "PORT N"
  --host H            default 127.0.0.1
  --latency-ms M      mean extra delay added to every tools/call
  --latency-dist D    fixed (default), lognormal (sigma 1) or pareto
                      (alpha 2.5): heavy-tailed delays with mean M
  --sse               answer tools/call as an SSE stream (text/event-stream)
                      instead of one JSON body
  --fail-rate P       answer this fraction of tools/call with HTTP 500
  --seed S            seed for latency and failure draws
  --verbose           log each request to stderr

Per request, for tests and experiments, these headers override the options:
  X-Calc-Latency-Ms: M   fixed extra delay for this request
  X-Calc-SSE: 1|0        SSE stream or JSON body for this request
"""
import argparse
import ast
import json
import math
import operator
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
MAX_EXPRESSION = 10000  # characters
MAX_INT_BITS = 100000  # bigger integer results are refused, not computed
MAX_REQUEST = 1 << 20  # bytes of one JSON-RPC message

if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)

TOOLS = [
    {
        "name": "calc",
        "title": "Calculator",
        "description": "Evaluate an arithmetic expression: integers and decimals, "
        "+ - * / // % ** and parentheses.",
        "inputSchema": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (2+3)*4"}},
            "required": ["expression"],
        },
    },
    {
        "name": "add",
        "description": "Add two numbers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "mul",
        "description": "Multiply two numbers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
]


class ToolError(Exception):
    """A failure reported to the caller as isError: true."""


def _pow(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b < 0:
            if a == 0:
                raise ToolError("division by zero")
            return float(a) ** b
        if abs(a) > 1 and b * a.bit_length() > MAX_INT_BITS:
            raise ToolError("result too large")
    return a**b


def _div(a, b):
    if b == 0:
        raise ToolError("division by zero")
    return a / b


def _floordiv(a, b):
    if b == 0:
        raise ToolError("division by zero")
    return a // b


def _mod(a, b):
    if b == 0:
        raise ToolError("division by zero")
    return a % b


def _mul(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if a.bit_length() + b.bit_length() > MAX_INT_BITS:
            raise ToolError("result too large")
    return a * b


BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: _div,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
}
UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ToolError("only numbers are allowed, not %r" % (v,))
        return v
    if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
        return BINOPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNOPS:
        return UNOPS[type(node.op)](_eval(node.operand))
    raise ToolError("not allowed in an expression: %s" % type(node).__name__)


def _fmt(v):
    if isinstance(v, complex):
        raise ToolError("result is not a real number")
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise ToolError("result is not a finite number")
        return repr(v)
    return str(v)


def calc(expression):
    if not isinstance(expression, str):
        raise ToolError("expression must be a string")
    if len(expression) > MAX_EXPRESSION:
        raise ToolError("expression longer than %d characters" % MAX_EXPRESSION)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise ToolError("malformed expression: %s" % getattr(e, "msg", str(e)))
    except (RecursionError, MemoryError):
        raise ToolError("expression nested too deeply")
    try:
        return _fmt(_eval(tree))
    except OverflowError:
        raise ToolError("result too large")
    except RecursionError:
        raise ToolError("expression nested too deeply")


def _number(args, key):
    v = args.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ToolError("argument %r must be a number" % key)
    return v


def call_tool(name, args):
    """Returns (text, is_error), or None when there is no such tool."""
    if not isinstance(args, dict):
        return "arguments must be an object", True
    try:
        if name == "calc":
            return calc(args.get("expression")), False
        if name == "add":
            return _fmt(_number(args, "a") + _number(args, "b")), False
        if name == "mul":
            return _fmt(_mul(_number(args, "a"), _number(args, "b"))), False
    except ToolError as e:
        return str(e), True
    except OverflowError:
        return "result too large", True
    except Exception as e:  # a bug here must not take the server down
        return "internal error: %s" % type(e).__name__, True
    return None


class Calc:
    """Settings and shared state of one server."""

    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.sessions = set()

    def latency_s(self):
        mean = self.args.latency_ms / 1000.0
        if mean <= 0:
            return 0.0
        dist = self.args.latency_dist
        with self.lock:
            if dist == "lognormal":
                sigma = 1.0  # E[X] = exp(mu + sigma^2/2) = mean
                return self.rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
            if dist == "pareto":
                alpha = 2.5  # E[X] = xm * alpha / (alpha - 1) = mean
                xm = mean * (alpha - 1) / alpha
                return min(xm * self.rng.paretovariate(alpha), 100 * mean)
        return mean

    def fail(self):
        if self.args.fail_rate <= 0:
            return False
        with self.lock:
            return self.rng.random() < self.args.fail_rate


def make_handler(calc_state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so clients reuse connections
        server_version = "calc_server/1"

        def log_message(self, fmt, *a):
            if calc_state.args.verbose:
                sys.stderr.write("calc_server: %s\n" % (fmt % a))

        def _send(self, code, body=b"", ctype="application/json", headers=None):
            if isinstance(body, str):
                body = body.encode()
            self.send_response(code)
            if body:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _rpc_error(self, code, rid, err_code, message, http=None):
            body = {"jsonrpc": "2.0", "id": rid, "error": {"code": err_code, "message": message}}
            self._send(http or code, json.dumps(body))

        def do_GET(self):
            if self.path.split("?")[0] == "/health":
                self._send(200, json.dumps({"status": "healthy"}))
            elif self.path.split("?")[0] == "/mcp":
                # No server-initiated stream is offered.
                self._send(405, "", headers={"Allow": "POST, DELETE"})
            else:
                self._send(404, json.dumps({"error": "not found"}))

        def do_DELETE(self):
            sid = self.headers.get("Mcp-Session-Id")
            with calc_state.lock:
                known = sid in calc_state.sessions
                calc_state.sessions.discard(sid)
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
                self._rpc_error(413 if n > 0 else 400, None, -32600, "bad Content-Length")
                return
            raw = self.rfile.read(n) if n > 0 else b""
            if self.path.split("?")[0] != "/mcp":
                self._send(404, json.dumps({"error": "not found"}))
                return
            accept = self.headers.get("Accept", "")
            if "application/json" not in accept or "text/event-stream" not in accept:
                self._rpc_error(406, None, -32600,
                                "Accept must list application/json and text/event-stream")
                return
            try:
                msg = json.loads(raw)
            except ValueError:
                self._rpc_error(400, None, -32700, "parse error")
                return
            if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
                self._rpc_error(400, None, -32600, "invalid request")
                return
            if "method" not in msg:  # a response from the client: nothing to do
                self._send(202)
                return
            method = msg["method"]
            rid = msg.get("id")
            if method != "initialize":
                sid = self.headers.get("Mcp-Session-Id")
                if not sid:
                    self._rpc_error(400, rid, -32600, "missing Mcp-Session-Id")
                    return
                with calc_state.lock:
                    known = sid in calc_state.sessions
                if not known:
                    self._rpc_error(404, rid, -32001, "session not found")
                    return
            if rid is None:  # a notification, e.g. notifications/initialized
                self._send(202)
                return
            params = msg.get("params") or {}
            if not isinstance(params, dict):
                self._rpc_error(200, rid, -32602, "params must be an object")
                return
            if method == "initialize":
                asked = params.get("protocolVersion")
                version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
                sid = uuid.uuid4().hex
                with calc_state.lock:
                    calc_state.sessions.add(sid)
                result = {
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "calc_server", "version": "1.0.0"},
                }
                self._reply(rid, result, headers={"Mcp-Session-Id": sid}, sse=False)
            elif method == "ping":
                self._reply(rid, {}, sse=False)
            elif method == "tools/list":
                self._reply(rid, {"tools": TOOLS}, sse=False)
            elif method == "tools/call":
                self._tools_call(rid, params)
            else:
                self._rpc_error(200, rid, -32601, "method not found: %s" % method)

        def _tools_call(self, rid, params):
            name = params.get("name")
            out = call_tool(name, params.get("arguments") or {})
            if out is None:
                self._rpc_error(200, rid, -32602, "unknown tool: %s" % (name,))
                return
            hdr = self.headers.get("X-Calc-Latency-Ms")
            delay = float(hdr) / 1000.0 if hdr else calc_state.latency_s()
            if calc_state.fail():
                if delay > 0:
                    time.sleep(delay)
                self._send(500, json.dumps({"error": "injected failure"}))
                return
            text, is_error = out
            result = {"content": [{"type": "text", "text": text}], "isError": is_error}
            hdr = self.headers.get("X-Calc-SSE")
            sse = calc_state.args.sse if hdr is None else hdr == "1"
            self._reply(rid, result, sse=sse, delay=delay)

        def _reply(self, rid, result, headers=None, sse=False, delay=0.0):
            resp = {"jsonrpc": "2.0", "id": rid, "result": result}
            if not sse:
                if delay > 0:
                    time.sleep(delay)
                self._send(200, json.dumps(resp), headers=headers)
                return
            # An SSE stream, sent in chunks as it happens: a progress
            # notification first, then the response. The response is
            # pretty-printed so it spans several data: lines, as the SSE
            # format allows.
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            note = {"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": "calculating"}}
            self._chunk("event: message\ndata: %s\n\n" % json.dumps(note))
            if delay > 0:
                time.sleep(delay)
            lines = json.dumps(resp, indent=1).split("\n")
            self._chunk("event: message\nid: %s\n" % rid
                        + "".join("data: %s\n" % ln for ln in lines) + "\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, text):
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # many clients connect at once
    allow_reuse_address = True


def main(argv=None):
    ap = argparse.ArgumentParser(description="MCP calculator server (streamable HTTP)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--latency-dist", choices=("fixed", "lognormal", "pareto"), default="fixed")
    ap.add_argument("--sse", action="store_true")
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if not 0.0 <= args.fail_rate <= 1.0:
        ap.error("--fail-rate must be between 0 and 1")
    if args.latency_ms < 0:
        ap.error("--latency-ms must not be negative")
    srv = Server((args.host, args.port), make_handler(Calc(args)))
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
