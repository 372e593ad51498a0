# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: HTTP(S) to engines, routers and metrics endpoints, the one way.

Every request goes through ``ansible.module_utils.urls.open_url`` (it needs no AnsibleModule, so modules,
filters, tests and benchmark scripts share it), imported when the first request is made. An ``opener``
with ``open_url``'s signature can be injected for tests. No other file of the collection imports
``urllib.request``, ``http.client`` or ``ansible.module_utils.urls`` (tests/unit/test_http_bounded.py).

Every answer is bounded, whatever the server does:

* ``timeout`` is a **deadline for the whole answer** (connection, headers and body), not for each socket read:
  the request runs on a thread of its own, the caller waits for it at most until the deadline, and the thread
  reads the body in chunks with the socket's timeout set to the time left before each read (a server that
  trickles a byte a second cannot stretch it), stopping at the deadline;
* ``max_bytes`` caps the body **while it is read** (:data:`MAX_ANSWER_BYTES` by default,
  :data:`MAX_METRICS_BYTES` for a Prometheus ``/metrics``, :data:`MAX_ERROR_BYTES` of an error answer): an
  endless body is refused at the cap, never read into memory;
* a stream (:func:`open_response`, server-sent events) is read under the same deadline and cap, its lines at
  most :data:`MAX_LINE_BYTES` each.

Failures raise :class:`HttpError`: ``status`` is the HTTP status of an error answer (its ``body`` and
``headers`` are kept), or None when no usable answer came (refused, reset, timed out, broke off, too large,
bad URL). Messages name the method and the URL as :func:`shown_url` prints it: credentials written in the URL
(``user:pass@``) and the query string never appear, neither in the URL nor in the underlying reason; they quote
an answer only through ``_untrusted.excerpt`` (never whole).

Options that take a URL refuse credentials in it (:func:`refuse_url_credentials`, called by every module with a
URL option before it does anything): a URL is echoed in results, ``invocation``, logs and AWX job events, so
credentials go through the module's separate ``no_log`` options (an ``Authorization`` header, a token).
"""
from __future__ import annotations

import http.client
import json
import queue
import re
import socket
import threading
import time
from urllib.error import HTTPError, URLError
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, excerpt, loads_json)

DEFAULT_TIMEOUT = 30.0
#: How much of an error answer's body a message shows.
BODY_SHOWN = 300
#: Largest body :func:`request` reads unless told otherwise: an engine's or a router's JSON answer (a model
#: list, a completion of a few thousand tokens) is KiB; more is refused while it is read.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
#: Largest Prometheus ``/metrics`` answer read: a vLLM or SGLang engine's is tens to hundreds of KiB (every
#: histogram of every model and DP rank); the same cap as any document the collection reads
#: (``_untrusted.MAX_BYTES``).
MAX_METRICS_BYTES = 16 * 1024 * 1024
#: Most of an error answer's body that is read (a message shows its start; the rest is dropped, not refused).
MAX_ERROR_BYTES = 64 * 1024
#: Longest line a stream may send (one server-sent event of one token is well under a KiB).
MAX_LINE_BYTES = 1024 * 1024
#: The most one socket read asks for.
_CHUNK = 64 * 1024


def shown_url(url):
    """``url`` for a message: credentials (``user:password@``) become ``***@``, a query string ``***``, and
    the fragment is left out."""
    try:
        u = urlsplit(str(url).strip())
        host = u.hostname or ""
        if ":" in host:
            host = "[%s]" % host
        if u.port:
            host = "%s:%d" % (host, u.port)
        if u.username is not None or u.password is not None:
            host = "***@" + host
        return urlunsplit((u.scheme, host, u.path, "***" if u.query else "", ""))
    except ValueError:
        return "the URL given"


def _secrets(url):
    """The parts of ``url`` a message must not show, longest first."""
    url = str(url).strip()
    found = set()
    try:
        u = urlsplit(url)
        netloc = u.netloc
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
            found.update((userinfo, unquote(userinfo)))
            for part in (u.password, u.username):
                if part and len(part) >= 3:
                    found.update((part, unquote(part)))
        if u.query:
            found.update((u.query, unquote(u.query)))
            for key, value in parse_qsl(u.query, keep_blank_values=True):
                if len(value) >= 3:
                    found.add(value)
    except ValueError:
        pass
    return sorted((s for s in found if s), key=len, reverse=True)


def redact(text, url):
    """``text`` with ``url`` shown as :func:`shown_url` prints it and its credentials and query values removed."""
    text = str(text)
    url = str(url).strip()
    if url:
        text = text.replace(url, shown_url(url))
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def _lower_headers(resp):
    try:
        return dict((str(k).lower(), v) for k, v in resp.headers.items())
    except AttributeError:
        return {}


def _status(resp):
    status = getattr(resp, "status", None)
    if status is None and hasattr(resp, "getcode"):
        status = resp.getcode()
    return int(status) if status is not None else 200


class HttpError(Exception):
    """A request that got no usable answer; ``str()`` names the method, the shown URL and why.

    ``status``: the HTTP status of an error answer, None when there was no answer (``timed_out``: none, or not
    all of it, within the deadline; ``refused``: nothing listens there; ``too_large``: the body went past the
    request's ``max_bytes``).
    ``body``: the error answer's text (``""`` without one). ``reason`` is the cause without the URL.
    """

    def __init__(self, method, url, reason, status=None, body="", headers=None, timed_out=False, refused=False,
                 too_large=False):
        self.method = method
        self.url = shown_url(url)
        self.reason = redact(reason, url)
        self.status = status
        self.body = redact(body or "", url)
        self.headers = headers or {}
        self.timed_out = timed_out
        self.refused = refused
        self.too_large = too_large
        detail = (": " + excerpt(self.body, BODY_SHOWN)) if self.body else ""
        super(HttpError, self).__init__("%s %s failed: %s%s" % (method, self.url, self.reason, detail))


class Response(object):
    """A read answer: ``status``, ``headers`` (lower-case names), ``body`` (bytes)."""

    def __init__(self, method, url, status, headers, body):
        self.method = method
        self.url = url
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def text(self):
        return self.body.decode("utf-8", "replace") if isinstance(self.body, bytes) else str(self.body)

    def json(self):
        """The body parsed as JSON under ``_untrusted``'s rules (size, nesting, finite numbers); HttpError (with
        ``status``) when it is not JSON or breaks a rule."""
        try:
            return loads_json(self.body, "the answer (HTTP %s)" % self.status)
        except UntrustedInput as e:
            shown = ": %s" % excerpt(self.body) if e.limit in ("syntax", "encoding") else ""
            raise HttpError(self.method, self.url, str(e) + shown, status=self.status)


def _default_opener():
    from ansible.module_utils.urls import open_url  # pylint: disable=import-outside-toplevel

    return open_url


def _transport_errors():
    errors = (URLError, OSError, http.client.HTTPException, ValueError)
    try:
        from ansible.module_utils.urls import ConnectionError as UrlsConnectionError  # pylint: disable=import-outside-toplevel
    except ImportError:
        return errors
    return errors + (UrlsConnectionError,)


def _is_timeout(exc):
    reason = getattr(exc, "reason", None) if isinstance(exc, URLError) else None
    cause = reason if isinstance(reason, BaseException) else exc
    return isinstance(cause, (socket.timeout, TimeoutError))


def _failure(method, url, exc, timeout, prefix=""):
    """The HttpError for a request that got no usable answer because of ``exc``."""
    reason = getattr(exc, "reason", None) if isinstance(exc, URLError) else None
    cause = reason if isinstance(reason, BaseException) else exc
    if _is_timeout(exc):
        return HttpError(method, url, prefix + "no answer within %gs (timed out)" % round(timeout, 2), timed_out=True)
    text = str(reason) if reason is not None else str(exc)
    return HttpError(method, url, prefix + (text or type(exc).__name__),
                     refused=isinstance(cause, ConnectionRefusedError))


def _socket_of(resp):
    """The socket an ``http.client`` answer reads from (also under urllib's ``HTTPError``), or None (an injected
    opener's answer)."""
    obj = resp
    for dummy in range(4):
        fp = getattr(obj, "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
        if sock is not None and hasattr(sock, "settimeout") and hasattr(sock, "shutdown"):
            return sock
        if fp is None:
            return None
        obj = fp
    return None


def _close(resp):
    close = getattr(resp, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # pylint: disable=broad-except  # closing is tidying up: its failure changes nothing
            pass


class _Exchange(object):
    """One request on a thread of its own: the thread opens it and reads the body in chunks into a queue; the
    caller takes from the queue, waiting at most until ``deadline`` (``time.monotonic()``).

    The thread sets the socket's timeout to the time left before each read and stops at the deadline, at
    ``max_bytes`` (one byte more is read, to know) or when the caller closes the exchange (the socket is then
    shut down under a blocked read). Items: ``("open", resp)``, ``("status", HTTPError)``, ``("data", bytes)``,
    ``("end", None)``, ``("over", None)``, ``("fail", exception)``.

    A thread still waiting for the headers at the deadline (their socket is not reachable before ``open_url``
    returns) is left to end on its own, at the opener's per-read timeout or when the server stops; it is a daemon
    and keeps neither the caller nor the process waiting, and it closes the answer if one comes.
    """

    def __init__(self, method, url, opener, kwargs, timeout, max_bytes):
        self.method = method
        self.url = url
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.deadline = time.monotonic() + timeout
        self.items = queue.Queue()
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._sock = None
        thread = threading.Thread(target=self._run, args=(opener, kwargs), name="llmops-http", daemon=True)
        thread.start()

    def _run(self, opener, kwargs):
        try:
            resp, kind = opener(self.url, **kwargs), "open"
        except HTTPError as e:
            resp, kind = e, "status"
        except BaseException as e:  # pylint: disable=broad-except  # handed to the caller, who raises it
            self.items.put(("fail", e))
            return
        with self._lock:
            self._sock = _socket_of(resp)
            stopped = self.stopped.is_set()
        try:
            if not stopped:
                self.items.put((kind, resp))
                self._read(resp, self.max_bytes if kind == "open" else MAX_ERROR_BYTES)
        finally:
            _close(resp)

    def _read(self, resp, limit):
        read = getattr(resp, "read1", None) or resp.read
        size = 0
        try:
            while not self.stopped.is_set():
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return  # the caller reports the deadline
                if self._sock is not None:
                    self._sock.settimeout(left)
                chunk = read(min(_CHUNK, limit + 1 - size))
                if not chunk:
                    missing = getattr(resp, "length", None)
                    if isinstance(missing, int) and not isinstance(missing, bool) and missing > 0:
                        raise http.client.IncompleteRead(b"", missing)  # the connection closed early
                    self.items.put(("end", None))
                    return
                size += len(chunk)
                self.items.put(("data", bytes(chunk)))
                if size > limit:
                    self.items.put(("over", None))
                    return
        except BaseException as e:  # pylint: disable=broad-except  # handed to the caller, who raises it
            if not self.stopped.is_set():
                self.items.put(("fail", e))

    def take(self):
        """The next item; ``("deadline", None)`` when none came before the deadline (items that came before it
        are still handed out)."""
        left = self.deadline - time.monotonic()
        try:
            return self.items.get(timeout=left) if left > 0 else self.items.get_nowait()
        except queue.Empty:
            return "deadline", None

    def close(self):
        """Stop the thread: no more reads; a read blocked on the socket returns at once."""
        with self._lock:
            self.stopped.set()
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed: the thread is done
                pass

    def expired(self, status=None):
        """The HttpError for the deadline passing (``status``: the answer's, once its headers came)."""
        if status is None:
            return HttpError(self.method, self.url, "no answer within %gs (timed out)" % round(self.timeout, 2), timed_out=True)
        return HttpError(self.method, self.url, "the answer (HTTP %d) did not end within %gs (timed out; the timeout "
                         "is a deadline for the whole answer, not for each read)" % (status, round(self.timeout, 2)),
                         timed_out=True)


class Stream(object):
    """An open answer (:func:`open_response`): ``status``, ``headers`` (lower-case names); its body read with
    :meth:`read`, :meth:`readline` or by iterating its lines, all of it within the request's deadline and
    ``max_bytes`` (else :class:`HttpError`: ``timed_out`` or ``too_large``). Close it when done (``with``)."""

    def __init__(self, exchange, resp):
        self._ex = exchange
        self.method = exchange.method
        self.url = exchange.url
        self.status = _status(resp)
        self.headers = _lower_headers(resp)
        self._buf = bytearray()
        self._done = False

    def _more(self):
        """Wait for the next chunk of the body into the buffer; False at its end."""
        if self._done:
            return False
        kind, value = self._ex.take()
        if kind == "data":
            self._buf += value
            return True
        self._done = True
        if kind == "end":
            return False
        self._ex.close()
        if kind == "deadline" or (kind == "fail" and _is_timeout(value)):
            raise self._ex.expired(self.status)
        if kind == "over":
            raise HttpError(self.method, self.url, "the answer (HTTP %d) is over the %d-byte limit for it (max_bytes); "
                            "the rest was not read" % (self.status, self._ex.max_bytes), too_large=True)
        raise _failure(self.method, self.url, value, self._ex.timeout, "the answer (HTTP %d) broke off: " % self.status)

    def read(self, size=-1):
        """``size`` bytes of the body (fewer at its end), or all the rest with ``size < 0``."""
        while (size < 0 or len(self._buf) < size) and self._more():
            pass
        n = len(self._buf) if size < 0 else min(size, len(self._buf))
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def readline(self, limit=MAX_LINE_BYTES):
        """The next line with its ``\\n`` (``b""`` at the end of the body); a line longer than ``limit`` bytes is
        :class:`HttpError` (``too_large``)."""
        start = 0
        while True:
            nl = self._buf.find(b"\n", start)
            if nl >= 0:
                break
            start = len(self._buf)
            if start > limit or not self._more():
                break
        end = nl + 1 if nl >= 0 else len(self._buf)
        if end > limit + 1:
            self.close()
            raise HttpError(self.method, self.url, "the answer (HTTP %d) sent a line of over %d bytes; the rest was not "
                            "read" % (self.status, limit), too_large=True)
        out = bytes(self._buf[:end])
        del self._buf[:end]
        return out

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def close(self):
        self._done = True
        self._ex.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_response(method, url, payload=None, data=None, headers=None, timeout=DEFAULT_TIMEOUT, opener=None,
                  validate_certs=True, max_bytes=MAX_ANSWER_BYTES):
    """Send the request; returns the open :class:`Stream` (the caller reads and closes it, e.g. server-sent
    events). ``timeout`` is the deadline for all of it: the answer's headers and every byte of its body read
    from the stream; ``max_bytes`` caps the body.

    ``payload`` is sent as JSON (with ``Content-Type: application/json``); ``data`` as given. Raises
    :class:`HttpError`: with ``status`` (body, at most :data:`MAX_ERROR_BYTES`, and headers read) for an HTTP
    error status, without when no answer came within the deadline.
    """
    hdrs = dict(headers or {})
    if payload is not None:
        hdrs.setdefault("Content-Type", "application/json")
        data = json.dumps(payload).encode("utf-8")
    opener = opener or _default_opener()
    # decompress=False: no gzip is asked for, and none is inflated (a small answer cannot become a huge one)
    kwargs = dict(method=method, data=data, headers=hdrs, timeout=timeout, validate_certs=validate_certs,
                  decompress=False)
    ex = _Exchange(method, url, opener, kwargs, timeout, max_bytes)
    kind, value = ex.take()
    if kind == "open":
        return Stream(ex, value)
    if kind == "status":
        body = _error_body(Stream(ex, value))
        raise HttpError(method, url, str(value), status=value.code, body=body, headers=_lower_headers(value))
    ex.close()
    if kind == "deadline":
        raise ex.expired()
    raise _failure(method, url, value, timeout)


def _error_body(stream):
    """The start of an error answer's body as text: what came of it before the deadline (a body that breaks off
    or trickles is no reason to hide the status)."""
    parts = []
    try:
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            parts.append(chunk)
    except HttpError:
        pass
    finally:
        stream.close()
    return b"".join(parts)[:MAX_ERROR_BYTES].decode("utf-8", "replace")


def request(method, url, payload=None, data=None, headers=None, timeout=DEFAULT_TIMEOUT, opener=None,
            validate_certs=True, max_bytes=MAX_ANSWER_BYTES):
    """Send the request and read the whole answer, all within ``timeout`` seconds and at most ``max_bytes``:
    a :class:`Response` (status below 400).

    Raises :class:`HttpError` for an error status, no answer, an answer that breaks off, does not end before the
    deadline (``timed_out``) or is larger than ``max_bytes`` (``too_large``).
    """
    with open_response(method, url, payload=payload, data=data, headers=headers, timeout=timeout, opener=opener,
                       validate_certs=validate_certs, max_bytes=max_bytes) as stream:
        body = stream.read()
    return Response(method, url, stream.status, stream.headers, body)


def get_text(url, headers=None, timeout=DEFAULT_TIMEOUT, opener=None, max_bytes=MAX_ANSWER_BYTES):
    """GET ``url``; its body as text."""
    return request("GET", url, headers=headers, timeout=timeout, opener=opener, max_bytes=max_bytes).text


def get_json(url, headers=None, timeout=DEFAULT_TIMEOUT, opener=None, max_bytes=MAX_ANSWER_BYTES):
    """GET ``url``; its body parsed as JSON."""
    return request("GET", url, headers=headers, timeout=timeout, opener=opener, max_bytes=max_bytes).json()


def post_json(url, payload, headers=None, timeout=DEFAULT_TIMEOUT, opener=None, max_bytes=MAX_ANSWER_BYTES):
    """POST ``payload`` as JSON to ``url``; the answer parsed as JSON."""
    return request("POST", url, payload=payload, headers=headers, timeout=timeout, opener=opener,
                   max_bytes=max_bytes).json()


# ---- credentials in URL options ---------------------------------------------------------------------------- #
# The rule of what is a credential in a URL is the collection's one rule (_secrets.credential_in_url: userinfo, and
# query or fragment parameters named like a credential: token, api_key, access_token, key, sig, password).

# url_userinfo is re-exported: callers and tests read a URL's credentials from the HTTP client's module
from ansible_collections.llmops.serving.plugins.module_utils.common._secrets import (  # noqa: E402,F401  pylint: disable=unused-import
    credential_in_url, secrets_of, split_userinfo, url_userinfo)


def without_userinfo(value):
    """``value`` with its credentials replaced by ``***`` (and, when it has a scheme, its query string too, as
    :func:`shown_url` prints it); ``value`` unchanged when it has none."""
    parts = split_userinfo(value)
    if parts is None:
        return value
    text = "%s***@%s" % (parts[0], parts[2])
    return shown_url(text) if parts[0] else text


def without_credentials(value):
    """``value`` as an echo may show it: without userinfo, and without its query and fragment when a parameter
    there is a credential (``http://h/x?***``)."""
    text = without_userinfo(value)
    if not credential_in_url(text):
        return text
    base = "".join(str(text).split()).split("#", 1)[0]
    return base.split("?", 1)[0] + ("?***" if "?" in base else "")


def userinfo_secrets(userinfo):
    """What must not be shown of a URL's ``userinfo``: itself (as written and percent-decoded) and its user and
    password parts of at least three characters."""
    return secrets_of(userinfo)


def _url_values(params, path):
    """``(shown name, container, key)`` of every value that ``path`` (``base_url``, ``targets[].url``) names."""
    name, dummy, rest = path.partition("[].")
    value = params.get(name) if isinstance(params, dict) else None
    if not rest:
        if isinstance(params, dict) and name in params:
            yield name, params, name
        return
    if not isinstance(value, list):
        return
    for i, item in enumerate(value):
        for shown, container, key in _url_values(item, rest):
            yield "%s[%d].%s" % (name, i, shown), container, key


def credential_problems(params, options):
    """``[(option as shown, [(where, secret)], container, key)]`` for each URL option of ``params`` that carries
    credentials (:func:`_secrets.credential_in_url`). ``options`` maps an option path (``base_url``,
    ``targets[].url``) to the fix (what to use instead) or to ``(fix, accepts)`` where ``accepts(value)`` says
    whether the value is a URL at all (for options that take Prometheus text or a URL)."""
    found = []
    for path, fix in options.items():
        accepts = fix[1] if isinstance(fix, tuple) else None
        for shown, container, key in _url_values(params, path):
            value = container.get(key)
            if accepts is not None and not accepts(value):
                continue
            creds = credential_in_url(value)
            if creds:
                found.append((shown, creds, container, key))
    return found


def refuse_url_credentials(module, options):
    """Fail ``module`` when a URL option carries a credential (``user:password@``, ``?token=``, ``?api_key=``),
    before anything is done.

    The credentials are added to ``module.no_log_values`` and the option's echo in ``invocation`` is replaced
    by the URL without them (:func:`without_credentials`), so neither the message, the invocation nor any
    registered result repeats them. ``options`` is as :func:`credential_problems` takes it (option path -> fix).
    """
    problems = credential_problems(module.params, options)
    if not problems:
        return
    msgs = []
    for shown, creds, container, key in problems:
        for dummy, secret in creds:
            module.no_log_values.update(secrets_of(secret))
        container[key] = without_credentials(container[key])
        path = re.sub(r"\[\d+\]", "[]", shown)
        fix = options[path][0] if isinstance(options[path], tuple) else options[path]
        what = ", ".join(sorted({w for w, dummy in creds}))
        msgs.append("%s: the URL carries credentials (%s), and a URL is shown in results, logs and job events; "
                    "remove them from the URL and %s" % (shown, what, fix))
    module.fail_json(msg="; ".join(msgs), reason="credentials_in_url",
                     options=[shown for shown, dummy, dummy2, dummy3 in problems])
