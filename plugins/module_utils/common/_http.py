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

Options that take a URL refuse credentials in it (:func:`refuse_url_credentials`, called by every module with a
URL option before it does anything): a URL is echoed in results, ``invocation``, logs and AWX job events, so
credentials go through the module's separate ``no_log`` options (an ``Authorization`` header, a token).
"""
from __future__ import annotations

import http.client
import json
import re
import socket
from urllib.error import HTTPError, URLError
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, loads_json

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
        """The body parsed as JSON under ``_untrusted``'s rules (size, nesting, finite numbers); HttpError (with
        ``status``) when it is not JSON or breaks a rule."""
        try:
            return loads_json(self.body, "the answer (HTTP %s)" % self.status)
        except UntrustedInput as e:
            shown = ": %r" % self.text[:BODY_SHOWN] if e.limit in ("syntax", "encoding") else ""
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


# ---- credentials in URL options ---------------------------------------------------------------------------- #
# The rule of what is a credential in a URL is the collection's one rule (_secrets.credential_in_url: userinfo, and
# query or fragment parameters named like a credential: token, api_key, access_token, key, sig, password).

from ansible_collections.llmops.serving.plugins.module_utils.common._secrets import (  # noqa: E402,F401
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
