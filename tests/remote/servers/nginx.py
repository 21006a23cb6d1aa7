#!/usr/bin/python3
"""Serves a directory with nginx on 127.0.0.1 for the remote-source tests.

nginx.py --root DIR [--tls]

Writes its config, pid, logs and temp paths into a fresh temp dir, listens on a free port,
prints `READY http://127.0.0.1:PORT` (or `READY https://127.0.0.1:PORT CAFILE=/path/ca.pem`
with --tls, where a throwaway CA signs a certificate for 127.0.0.1 and localhost, and the
listener offers HTTP/2) and serves until SIGTERM. Range requests and ETags are nginx's
defaults; /__redirect/ftp and /__redirect/loop answer redirects a client must refuse. A line without READY says why it cannot serve (the test skips with it).
"""
import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

NGINX = "/usr/sbin/nginx"


PR_SET_PDEATHSIG = 1


def die_with_parent(sig=signal.SIGTERM):
    """Asks the kernel for `sig` when the parent dies: a test killed outright leaves no server."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_certs(tmp):
    """A CA and a server certificate it signs, for 127.0.0.1 and localhost (EC keys: fast)."""
    ca_key, ca_pem = os.path.join(tmp, "ca.key"), os.path.join(tmp, "ca.pem")
    key, csr, pem = (os.path.join(tmp, n) for n in ("server.key", "server.csr", "server.pem"))
    ext = os.path.join(tmp, "server.ext")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca_pem, "-days", "2",
         "-subj", "/CN=eredu test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    run(["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"])
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run(["openssl", "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial",
         "-out", pem, "-days", "2", "-extfile", ext])
    return ca_pem, pem, key


def config(tmp, root, port, tls):
    listen = f"listen 127.0.0.1:{port}" + (" ssl http2;" if tls else ";")
    ssl = ""
    if tls:
        ssl = (f"ssl_certificate {tmp}/server.pem;\n    ssl_certificate_key {tmp}/server.key;\n"
               "    ssl_protocols TLSv1.2 TLSv1.3;")
    temps = "\n  ".join(f"{name}_temp_path {tmp}/{name};"
                        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 512; }}
http {{
  access_log off;
  {temps}
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 60s;
  keepalive_requests 100000;
  default_type application/octet-stream;
  server {{
    {listen}
    {ssl}
    root {root};
    location / {{ }}
    # Redirects the client must refuse: to another scheme, and in a loop.
    location = /__redirect/ftp {{ return 302 ftp://127.0.0.1/x; }}
    location = /__redirect/loop {{ return 302 /__redirect/loop; }}
  }}
}}
"""


def wait_listening(port, proc, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--tls", action="store_true")
    args = ap.parse_args()
    if not os.access(NGINX, os.X_OK):
        print(f"nginx not found at {NGINX} (Debian: nginx-light)", flush=True)
        return 1
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the test died before the request took effect
        return 1
    root = os.path.abspath(args.root)
    tmp = tempfile.mkdtemp(prefix="eredu-nginx-")
    proc = None

    def stop(*_):
        # Only unwinds: the cleanup is in `finally` (waiting on nginx inside a signal handler
        # would deadlock with a wait the main flow is in).
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        ca = None
        if args.tls:
            try:
                ca, _, _ = make_certs(tmp)
            except (OSError, subprocess.CalledProcessError) as e:
                print(f"cannot make test certificates with openssl: {e}", flush=True)
                return 1
        for _ in range(20):  # the port found free may be taken before nginx binds it
            port = free_port()
            conf = os.path.join(tmp, "nginx.conf")
            with open(conf, "w") as f:
                f.write(config(tmp, root, port, args.tls))
            proc = subprocess.Popen([NGINX, "-p", tmp, "-e", f"{tmp}/error.log", "-c", conf],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    preexec_fn=lambda: die_with_parent(signal.SIGKILL))
            if wait_listening(port, proc):
                break
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc = None
        if proc is None:
            try:
                with open(os.path.join(tmp, "error.log")) as f:
                    last = f.read().strip().splitlines()[-1:]
            except OSError:
                last = []
            print("nginx did not start: " + (last[0] if last else "no error log"), flush=True)
            return 1
        scheme = "https" if args.tls else "http"
        line = f"READY {scheme}://127.0.0.1:{port}"
        if ca:
            line += f" CAFILE={ca}"
        print(line, flush=True)
        proc.wait()
        print("nginx exited", flush=True)
        return 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()  # a throwaway server: nothing to flush
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
