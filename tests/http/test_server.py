# python3 tests/http/test_server.py --port 0
"""A misbehaving HTTP server for the HTTP client and MCP client tests.

Prints "PORT <n>" as its first stdout line, then serves until killed.

Plain HTTP paths (any method):
  /echo                 200, JSON {method, path, headers, body} of the request
  /status/<code>        that status, small text body
  /slow/<ms>            sleep <ms>, then 200 "slow"
  /big/<n>              200 with <n> bytes and a Content-Length
  /big-chunked/<n>      200 with <n> bytes, chunked (no Content-Length)
  /flaky/<key>/<n>      503 for the first <n> requests with this key, then 200
  /count/<key>          200, body = how many requests /flaky/<key> has seen
  /stream/<ms>           chunked: "hello\n" at once, "bye\n" after <ms>
  /hangup               closes the connection without answering
  /garbage              200 application/json with a body that is not JSON

A minimal MCP endpoint, /mcp/<mode>: initialize, notifications and tools/list
answer correctly; tools/call answers according to <mode>:
  ok            JSON result, content text "ok"
  sse           SSE stream with a notification first, then the response
  garbage       200 application/json, body not JSON
  wrongtype     200 text/plain
  truncated     SSE stream cut in the middle of the response event
  noresponse    SSE stream that ends without the response
  wrongid       JSON response with another id
  notrpc        JSON that is not a JSON-RPC response
  error         JSON-RPC error object (-32000)
  status500     HTTP 500
  big           a JSON result with 1 MiB of text
  hangup        closes the connection without answering
  slow          sleeps 3 s, then answers
  sseopen       SSE stream with the response, then kept open for 5 s
  expire        404 (the session is gone)
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_flaky_lock = threading.Lock()
_flaky_seen = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, code, body=b"", ctype="text/plain", headers=None):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _start_chunked(self, ctype):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _hangup(self):
        self.close_connection = True
        try:
            self.connection.shutdown(2)
        except OSError:
            pass

    def do_GET(self):
        self._route()

    def do_POST(self):
        self._route()

    def do_PUT(self):
        self._route()

    def do_DELETE(self):
        self._route()

    def do_HEAD(self):
        self._route()

    def _route(self):
        body = self._body()
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        head = parts[0] if parts else ""
        try:
            if head == "echo":
                out = {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k: v for k, v in self.headers.items()},
                    "body": body.decode("utf-8", "replace"),
                }
                self._send(200, json.dumps(out), "application/json")
            elif head == "status":
                self._send(int(parts[1]), "status %s" % parts[1])
            elif head == "slow":
                time.sleep(int(parts[1]) / 1000.0)
                self._send(200, "slow")
            elif head == "big":
                self._send(200, b"x" * int(parts[1]))
            elif head == "big-chunked":
                n = int(parts[1])
                self._start_chunked("text/plain")
                while n > 0:
                    k = min(n, 65536)
                    self._chunk(b"y" * k)
                    n -= k
                self.wfile.write(b"0\r\n\r\n")
            elif head == "flaky":
                key, n = parts[1], int(parts[2])
                with _flaky_lock:
                    seen = _flaky_seen.get(key, 0)
                    _flaky_seen[key] = seen + 1
                if seen < n:
                    self._send(503, "try again")
                else:
                    self._send(200, "finally")
            elif head == "count":
                with _flaky_lock:
                    self._send(200, str(_flaky_seen.get(parts[1], 0)))
            elif head == "stream":
                self._start_chunked("text/plain")
                self._chunk("hello\n")
                time.sleep(int(parts[1]) / 1000.0)
                self._chunk("bye\n")
                self.wfile.write(b"0\r\n\r\n")
            elif head == "hangup":
                self._hangup()
            elif head == "garbage":
                self._send(200, '{"jsonrpc": "2.0", "id": 1, "result": {', "application/json")
            elif head == "mcp":
                self._mcp(parts[1] if len(parts) > 1 else "ok", body)
            else:
                self._send(404, "no such path")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _mcp(self, mode, body):
        try:
            msg = json.loads(body)
        except ValueError:
            self._send(400, "bad json")
            return
        if "id" not in msg:
            self._send(202)
            return
        rid, method = msg["id"], msg.get("method")

        def reply(obj, code=200, headers=None):
            self._send(code, json.dumps(obj), "application/json", headers)

        if method == "initialize":
            reply(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "protocolVersion": msg["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "test_server", "version": "0"},
                    },
                },
                headers={"Mcp-Session-Id": "test-session-" + mode},
            )
            return
        if method == "tools/list":
            reply({"jsonrpc": "2.0", "id": rid, "result": {"tools": []}})
            return
        ok = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "ok"}]}}
        if mode == "ok":
            reply(ok)
        elif mode == "sse":
            self._start_chunked("text/event-stream")
            note = {"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": "working"}}
            self._chunk("event: message\ndata: %s\n\n" % json.dumps(note))
            self._chunk(": a comment\r\nid: 7\r\ndata: %s\r\n\r\n" % json.dumps(ok))
            self.wfile.write(b"0\r\n\r\n")
        elif mode == "sseopen":
            self._start_chunked("text/event-stream")
            self._chunk("data: %s\n\n" % json.dumps(ok))
            time.sleep(5)
            self.wfile.write(b"0\r\n\r\n")
        elif mode == "garbage":
            self._send(200, "this is { not json", "application/json")
        elif mode == "wrongtype":
            self._send(200, json.dumps(ok), "text/plain")
        elif mode == "truncated":
            self._start_chunked("text/event-stream")
            text = json.dumps(ok)
            self._chunk("data: %s" % text[: len(text) // 2])
            self.wfile.write(b"0\r\n\r\n")
        elif mode == "noresponse":
            self._start_chunked("text/event-stream")
            note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
            self._chunk("data: %s\n\n" % json.dumps(note))
            self.wfile.write(b"0\r\n\r\n")
        elif mode == "wrongid":
            ok["id"] = 987654
            reply(ok)
        elif mode == "notrpc":
            reply({"hello": "world"})
        elif mode == "error":
            reply({"jsonrpc": "2.0", "id": rid,
                   "error": {"code": -32000, "message": "tool exploded"}})
        elif mode == "status500":
            self._send(500, "internal error")
        elif mode == "big":
            ok["result"]["content"][0]["text"] = "z" * (1 << 20)
            reply(ok)
        elif mode == "hangup":
            self._hangup()
        elif mode == "slow":
            time.sleep(3)
            reply(ok)
        elif mode == "expire":
            self._send(404, "session not found")
        else:
            self._send(404, "unknown mode")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that hangs up on purpose (a TLS hello sent to this plain
        # server, a stream ended early) is not a server error: stay quiet.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    srv = Server(("127.0.0.1", args.port), Handler)
    print("PORT %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
