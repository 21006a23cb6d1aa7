"""A verifying front for an S3 server that does not check signatures (s3rver).

Each request's SigV4 signature is recomputed with botocore (AWS's own signer) over exactly the
headers its SignedHeaders names, with the secret the test knows; a mismatch is answered 403 with
S3's XML `SignatureDoesNotMatch`, as S3 answers. A request that passes is forwarded, body and
headers (Range, If-Match, ETag, Content-Range...) intact, to the server behind, over kept-alive
connections; the answer is streamed back. Virtual-host requests (`Host: BUCKET.localhost:PORT`)
are forwarded path-style, so the server behind needs no DNS. s3rver ignores If-Match: the front
answers 412 PreconditionFailed itself when the object's ETag is not the one asked for; and
s3rver answers `Range: bytes=0-0` with the whole object, which the front cuts to the byte asked.

s3rver itself checks only the access key, so this front is what proves eredu's signing.
"""

import datetime
import hmac
import http.client
import http.server
import re
import threading
import urllib.parse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host",
}
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/,]+)/(\d{8})/([^/,]+)/([^/,]+)/aws4_request,\s*"
    r"SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")
_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_CHUNK = 1 << 20
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def _xml_error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()


class Config:
    """What the front checks and where it forwards."""

    def __init__(self, backend_port, bucket, access_key, secret, region, allow_anonymous, max_keys):
        self.backend_port = backend_port
        self.bucket = bucket
        self.access_key = access_key
        self.secret = secret
        self.region = region
        self.allow_anonymous = allow_anonymous
        self.max_keys = max_keys


def verify(config, method, target, headers):
    """None when the request may pass, else (status, S3 error code, message).

    `headers` maps lower-case names to lists of values, as received."""
    auth = headers.get("authorization")
    if not auth:
        if config.allow_anonymous:
            return None
        return 403, "AccessDenied", "Anonymous access is not allowed by this front"
    m = _AUTH.match(auth[0])
    if not m:
        return 400, "AuthorizationHeaderMalformed", "The Authorization header is not AWS4-HMAC-SHA256"
    key, date, region, service, signed, signature = m.groups()
    if key != config.access_key:
        return 403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    if region != config.region or service != "s3":
        return 400, "AuthorizationHeaderMalformed", f"the region or service of the scope is wrong; expecting '{config.region}'"
    names = signed.split(";")
    if names != sorted(names) or "host" not in names or "x-amz-date" not in names \
            or "x-amz-content-sha256" not in names:
        return 403, "AccessDenied", "SignedHeaders must be sorted and include host, x-amz-date and x-amz-content-sha256"
    if any(n not in headers for n in names):
        return 403, "SignatureDoesNotMatch", "a signed header is missing from the request"
    amz_date = headers["x-amz-date"][0]
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return 403, "AccessDenied", "x-amz-date is malformed"
    if amz_date[:8] != date:
        return 403, "SignatureDoesNotMatch", "the scope's date is not x-amz-date's"
    if abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) > 15 * 60:
        return 403, "RequestTimeTooSkewed", "The difference between the request time and the current time is too large."
    payload = headers["x-amz-content-sha256"][0]
    if method in ("GET", "HEAD") and payload not in (_EMPTY_SHA256, "UNSIGNED-PAYLOAD"):
        return 400, "XAmzContentSHA256Mismatch", "a request without a body must sign the empty body's hash"
    token = headers.get("x-amz-security-token", [None])[0] if "x-amz-security-token" in names else None
    request = AWSRequest(method=method, url=f"http://{headers['host'][0]}{target}")
    for name in names:
        request.headers[name] = ",".join(headers[name])
    request.context["timestamp"] = amz_date
    signer = S3SigV4Auth(Credentials(key, config.secret, token), "s3", region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, signature):
        return 403, "SignatureDoesNotMatch", ("The request signature we calculated does not match the signature "
                                              "you provided. Check your key and signing method.")
    return None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    config = None  # set by make_server
    _local = threading.local()

    def log_message(self, format, *args):  # noqa: A002 - quiet: the test's output is the log
        pass

    def handle(self):
        # A client that drops its connection (a cancelled or refused transfer) is not an error.
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass

    def _headers(self):
        out = {}
        for name, value in self.headers.items():
            out.setdefault(name.lower(), []).append(value.strip())
        return out

    def _answer_error(self, status, code, message):
        body = _xml_error(code, message)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _backend(self, fresh=False):
        conn = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", self.config.backend_port, timeout=60)
            self._local.conn = conn
        return conn

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        while length > 0:
            chunk = self.rfile.read(min(length, _CHUNK))
            if not chunk:
                break
            length -= len(chunk)
            yield chunk

    def _forward(self):
        headers = self._headers()
        failure = verify(self.config, self.command, self.path, headers)
        if failure:
            # Drain a body we will not forward, so the connection stays usable.
            for _ in self._body():
                pass
            self._answer_error(*failure)
            return
        target = self.path
        host = headers.get("host", [""])[0].split(":")[0]
        if host.startswith(self.config.bucket + "."):
            target = f"/{self.config.bucket}{target}"
        split = urllib.parse.urlsplit(target)
        if self.config.max_keys and "list-type=2" in split.query.split("&"):
            target = f"{split.path}?{split.query}&max-keys={self.config.max_keys}"
        out_headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
        out_headers["Host"] = f"127.0.0.1:{self.config.backend_port}"
        has_body = "Content-Length" in self.headers
        for attempt in (0, 1):
            conn = self._backend(fresh=attempt == 1)
            try:
                conn.request(self.command, target, body=self._body() if has_body else None, headers=out_headers)
                response = conn.getresponse()
                break
            except (ConnectionError, http.client.HTTPException):
                if attempt == 1 or has_body:
                    raise
        # s3rver ignores If-Match; S3 answers 412 when the object's ETag is not among those given.
        if_match = self.headers.get("If-Match")
        if if_match and response.status in (200, 206) and if_match.strip() != "*":
            etag = response.getheader("ETag", "")
            if etag not in [t.strip() for t in if_match.split(",")]:
                response.read()
                self._answer_error(412, "PreconditionFailed",
                                   "At least one of the pre-conditions you specified did not hold")
                return
        length = response.getheader("Content-Length")
        content_range = response.getheader("Content-Range")
        # s3rver reads `bytes=0-0` as `bytes=0-` (its end 0 is falsy): S3 sends the one byte asked.
        asked = _RANGE.match(self.headers.get("Range", ""))
        sent = _CONTENT_RANGE.match(content_range or "")
        limit = None
        if response.status == 206 and asked and asked.group(2) and sent and int(sent.group(2)) > int(asked.group(2)):
            first, last, size = int(sent.group(1)), int(asked.group(2)), sent.group(3)
            limit = last - first + 1
            length = str(limit)
            content_range = f"bytes {first}-{last}/{size}"
        body = None
        if length is None and self.command != "HEAD" and response.status not in (204, 304):
            body = response.read()
            length = str(len(body))
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP and name.lower() not in ("content-length", "content-range", "date",
                                                                        "server"):
                self.send_header(name, value)
        if content_range is not None:
            self.send_header("Content-Range", content_range)
        if length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        if body is not None:
            self.wfile.write(body)
        elif self.command != "HEAD":
            left = limit
            while left is None or left > 0:
                chunk = response.read(_CHUNK if left is None else min(_CHUNK, left))
                if not chunk:
                    break
                if left is not None:
                    left -= len(chunk)
                self.wfile.write(chunk)
            if limit is not None:
                response.read()  # the bytes past the range, so the backend connection stays usable
        else:
            response.read()

    do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = _forward


def make_server(config):
    """A threaded HTTP/1.1 server on 127.0.0.1 and a free port; the caller serves it."""
    handler = type("Handler", (_Handler,), {"config": config})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server
