#!/usr/bin/python3
"""An HTTP/1.1 proxy that injects faults in front of a real server (nginx), for the HTTP tests.

fault_proxy.py --upstream http://127.0.0.1:PORT --mode MODE [--count K] [--after N]
               [--replace-path /other.bin]

Listens on a free port of 127.0.0.1, prints `READY http://127.0.0.1:PORT` and serves until
SIGTERM. Each request is forwarded to the upstream (one connection per request); the first K
requests (--count, default 1; -1: every request) get the fault of MODE:
  reset         send the head and N body bytes, then reset the connection
  stall         send the head and N body bytes, then send nothing more (until the client leaves)
  503, 429      answer that status (Retry-After: 0) instead of forwarding
  short         send the head (the full Content-Length) and N body bytes, then close cleanly
  ignore_range  forward without the Range header: the upstream answers 200 with the whole file
  replace       every request after the first K is served from --replace-path (another file,
                so another ETag; the upstream answers If-Match with 412 as a real server would)
  403, 404      answer that status
  pass          no fault
--delay-ms D delays every answer by D ms (so that concurrent requests overlap). GET /__stats
answers JSON counters (requests, active, max_active) without being counted or faulted.
"""
import argparse
import asyncio
import ctypes
import os
import json
import signal
import sys
import urllib.parse

STATUS_TEXT = {403: "Forbidden", 404: "Not Found", 429: "Too Many Requests", 503: "Service Unavailable"}


class Proxy:
    def __init__(self, args):
        up = urllib.parse.urlsplit(args.upstream)
        self.host, self.port = up.hostname, up.port or 80
        self.mode, self.count, self.after = args.mode, args.count, args.after
        self.replace_path = args.replace_path
        self.seen = 0
        self.delay = args.delay_ms / 1000.0
        self.active = 0
        self.max_active = 0

    def faulty(self, index):
        return self.count < 0 or index < self.count

    async def upstream(self, method, target, headers):
        reader, writer = await asyncio.open_connection(self.host, self.port)
        lines = [f"{method} {target} HTTP/1.1"]
        for name, value in headers:
            if name.lower() in ("connection", "keep-alive", "proxy-connection"):
                continue
            lines.append(f"{name}: {value}")
        lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        data = await reader.read()  # the whole answer: Connection: close
        writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return head.decode("latin-1").split("\r\n"), body

    async def serve(self, reader, writer):
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                lines = request.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = []
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers.append((name.strip(), value.strip()))
                if target == "/__stats":
                    body = json.dumps({"requests": self.seen, "active": self.active,
                                       "max_active": self.max_active}).encode()
                    writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                    await writer.drain()
                    continue
                index = self.seen
                self.seen += 1
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                try:
                    if not await self.answer(reader, writer, index, method, target, headers):
                        return
                finally:
                    self.active -= 1
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def answer(self, reader, writer, index, method, target, headers):
        """Answers one request; False when the connection is done."""
        faulty = self.faulty(index)
        mode = self.mode
        if self.delay:
            await asyncio.sleep(self.delay)
        if faulty and mode in ("503", "429", "403", "404"):
            code = int(mode)
            body = f"{code} {STATUS_TEXT[code]}\n".encode()
            writer.write((f"HTTP/1.1 {code} {STATUS_TEXT[code]}\r\nContent-Length: {len(body)}\r\n"
                          "Retry-After: 0\r\nContent-Type: text/plain\r\n\r\n").encode() + body)
            await writer.drain()
            return True
        if faulty and mode == "ignore_range":
            headers = [(n, v) for n, v in headers if n.lower() != "range"]
        if mode == "replace" and not faulty and self.replace_path:
            target = self.replace_path
        head, body = await self.upstream(method, target, headers)
        head = [h for h in head if not h.lower().startswith("connection:")]
        out_head = ("\r\n".join(head) + "\r\nConnection: keep-alive\r\n\r\n").encode("latin-1")
        if faulty and mode in ("reset", "stall", "short"):
            writer.write(out_head + body[: self.after])
            await writer.drain()
            if mode == "reset":
                writer.transport.abort()
            elif mode == "stall":
                await reader.read()  # hold the connection until the client leaves
            return False
        writer.write(out_head + body)
        await writer.drain()
        return True


def die_with_parent():
    """SIGTERM when the parent (the test) dies, even killed outright (PR_SET_PDEATHSIG)."""
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != parent:
        sys.exit(1)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--mode", required=True,
                    choices=["reset", "stall", "503", "429", "short", "ignore_range", "replace", "403", "404",
                             "pass"])
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--after", type=int, default=1000)
    ap.add_argument("--replace-path", default="")
    ap.add_argument("--delay-ms", type=int, default=0)
    args = ap.parse_args()
    proxy = Proxy(args)
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    print(f"READY http://127.0.0.1:{port}", flush=True)
    async with server:
        await stop


if __name__ == "__main__":
    die_with_parent()
    asyncio.run(main())
    sys.exit(0)
