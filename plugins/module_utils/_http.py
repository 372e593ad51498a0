# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: HTTP(S) to engines, routers and metrics endpoints, the one way.

Every request goes through ``ansible.module_utils.urls.open_url`` (it needs no AnsibleModule, so modules,
filters, tests and benchmark scripts share it), imported when the first request is made. An ``opener``
with ``open_url``'s signature can be injected for tests.

Failures raise :class:`HttpError`: ``status`` is the HTTP status of an error answer (its ``body`` and
``headers`` are kept), or None when no usable answer came (refused, reset, timed out, broke off, bad URL).
Messages name the method and the URL as :func:`shown_url` prints it: credentials written in the URL
(``user:pass@``) and the query string never appear, neither in the URL nor in the underlying reason.
"""
from __future__ import annotations

import http.client
import json
import socket
from urllib.error import HTTPError, URLError
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

DEFAULT_TIMEOUT = 30.0
#: How much of an error answer's body a message shows.
BODY_SHOWN = 300


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

    ``status``: the HTTP status of an error answer, None when there was no answer (``timed_out``: none within
    the timeout; ``refused``: nothing listens there).
    ``body``: the error answer's text (``""`` without one). ``reason`` is the cause without the URL.
    """

    def __init__(self, method, url, reason, status=None, body="", headers=None, timed_out=False, refused=False):
        self.method = method
        self.url = shown_url(url)
        self.reason = redact(reason, url)
        self.status = status
        self.body = redact(body or "", url)
        self.headers = headers or {}
        self.timed_out = timed_out
        self.refused = refused
        detail = (": " + self.body[:BODY_SHOWN]) if self.body else ""
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
        """The body parsed as JSON; HttpError (with ``status``) when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            raise HttpError(self.method, self.url, "the answer (HTTP %s) is not JSON: %r"
                            % (self.status, self.text[:BODY_SHOWN]), status=self.status)


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


def _failure(method, url, exc, timeout, prefix=""):
    """The HttpError for a request that got no usable answer because of ``exc``."""
    reason = getattr(exc, "reason", None) if isinstance(exc, URLError) else None
    cause = reason if isinstance(reason, BaseException) else exc
    if isinstance(cause, (socket.timeout, TimeoutError)):
        return HttpError(method, url, prefix + "no answer within %gs (timed out)" % timeout, timed_out=True)
    text = str(reason) if reason is not None else str(exc)
    return HttpError(method, url, prefix + (text or type(exc).__name__),
                     refused=isinstance(cause, ConnectionRefusedError))


def open_response(method, url, payload=None, data=None, headers=None, timeout=DEFAULT_TIMEOUT, opener=None,
                  validate_certs=True):
    """Send the request; returns the open response (the caller reads and closes it, e.g. a stream).

    ``payload`` is sent as JSON (with ``Content-Type: application/json``); ``data`` as given. Raises
    :class:`HttpError`: with ``status`` (body and headers read) for an HTTP error status, without when no
    answer came.
    """
    hdrs = dict(headers or {})
    if payload is not None:
        hdrs.setdefault("Content-Type", "application/json")
        data = json.dumps(payload).encode("utf-8")
    opener = opener or _default_opener()
    try:
        return opener(url, method=method, data=data, headers=hdrs, timeout=timeout, validate_certs=validate_certs)
    except HTTPError as e:
        try:
            body = e.read().decode("utf-8", "replace") if hasattr(e, "read") else ""
        except Exception:  # a body that breaks off is no reason to hide the status
            body = ""
        raise HttpError(method, url, str(e), status=e.code, body=body, headers=_lower_headers(e))
    except _transport_errors() as e:
        raise _failure(method, url, e, timeout)


def request(method, url, payload=None, data=None, headers=None, timeout=DEFAULT_TIMEOUT, opener=None,
            validate_certs=True):
    """Send the request and read the whole answer: a :class:`Response` (status below 400).

    Raises :class:`HttpError` for an error status, no answer, or an answer that breaks off.
    """
    resp = open_response(method, url, payload=payload, data=data, headers=headers, timeout=timeout,
                         opener=opener, validate_certs=validate_certs)
    try:
        body = resp.read()
    except _transport_errors() as e:
        raise _failure(method, url, e, timeout, "the answer (HTTP %d) broke off: " % _status(resp))
    finally:
        close = getattr(resp, "close", None)
        if close is not None:
            close()
    return Response(method, url, _status(resp), _lower_headers(resp), body)


def get_text(url, headers=None, timeout=DEFAULT_TIMEOUT, opener=None):
    """GET ``url``; its body as text."""
    return request("GET", url, headers=headers, timeout=timeout, opener=opener).text


def get_json(url, headers=None, timeout=DEFAULT_TIMEOUT, opener=None):
    """GET ``url``; its body parsed as JSON."""
    return request("GET", url, headers=headers, timeout=timeout, opener=opener).json()


def post_json(url, payload, headers=None, timeout=DEFAULT_TIMEOUT, opener=None):
    """POST ``payload`` as JSON to ``url``; the answer parsed as JSON."""
    return request("POST", url, payload=payload, headers=headers, timeout=timeout, opener=opener).json()
