# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the one Kubernetes API client of the modules that talk to the API.

The modules take kubernetes.core's authentication options (``extends_documentation_fragment:
kubernetes.core.k8s_auth_options``) with the same environment fallbacks, so the ``K8S_AUTH_*`` variables an
AWX "OpenShift or Kubernetes API Bearer Token" credential injects, a kubeconfig, an in-cluster service
account and ``module_defaults`` shared with ``kubernetes.core.k8s`` all reach the same API server with the
same identity.

Restated from kubernetes.core 6.x (``plugins/module_utils/args_common.py`` AUTH_ARG_SPEC / AUTH_ARG_MAP and
``plugins/module_utils/k8s/client.py`` ``_create_auth_spec``, ``_create_configuration``, ``_create_headers``):

* an option set on the task (or through ``module_defaults``) wins; otherwise ``K8S_AUTH_<OPTION>`` or
  ``K8S_AUTH_<CLIENT NAME>`` (``K8S_AUTH_VALIDATE_CERTS`` or ``K8S_AUTH_VERIFY_SSL``, ``K8S_AUTH_CA_CERT`` or
  ``K8S_AUTH_SSL_CA_CERT``, ``K8S_AUTH_CLIENT_CERT`` or ``K8S_AUTH_CERT_FILE`` ...); a boolean variable is false
  when it is ``0``, ``false`` or ``no`` (any case) and true otherwise;
* ``host`` with ``api_key`` (or username/password, or client cert/key) is enough: no kubeconfig is read.
  Else a ``kubeconfig``/``context`` is loaded; else the in-cluster service account, then the default kubeconfig;
  the options given then override what was loaded;
* ``impersonate_user``/``impersonate_groups`` become ``Impersonate-User``/``Impersonate-Group`` headers.

Differences, each on purpose: the configuration is built into a fresh ``Configuration`` (kubernetes.core loads
into the client's process-wide default); username/password become a Basic ``Authorization`` header (the
kubernetes client would otherwise send none); ``GET /version`` is asked once so a wrong host, an unverifiable
certificate or a rejected token fails before the module reads anything, with the option that fixes it.
Secrets (api_key, password, proxy credentials, an inline kubeconfig) never appear in an error.
"""
from __future__ import annotations

import os

# The options of kubernetes.core.k8s_auth_options, as kubernetes.core's modules declare them.
AUTH_PROXY_HEADERS_SPEC = dict(
    proxy_basic_auth=dict(type="str", no_log=True),
    basic_auth=dict(type="str", no_log=True),
    user_agent=dict(type="str"),
)

AUTH_ARG_SPEC = {
    "kubeconfig": {"type": "raw", "no_log": True},
    "context": {},
    "host": {},
    "api_key": {"no_log": True},
    "username": {},
    "password": {"no_log": True},
    "validate_certs": {"type": "bool", "aliases": ["verify_ssl"]},
    "ca_cert": {"type": "path", "aliases": ["ssl_ca_cert"]},
    "client_cert": {"type": "path", "aliases": ["cert_file"]},
    "client_key": {"type": "path", "aliases": ["key_file"]},
    "proxy": {"type": "str"},
    "no_proxy": {"type": "str"},
    "proxy_headers": {"type": "dict", "options": AUTH_PROXY_HEADERS_SPEC},
    "persist_config": {"type": "bool"},
    "impersonate_user": {},
    "impersonate_groups": {"type": "list", "elements": "str"},
}

# kubernetes client Configuration name -> module option (the client name is the second K8S_AUTH_ spelling).
AUTH_ARG_MAP = {
    "kubeconfig": "kubeconfig",
    "context": "context",
    "host": "host",
    "api_key": "api_key",
    "username": "username",
    "password": "password",
    "verify_ssl": "validate_certs",
    "ssl_ca_cert": "ca_cert",
    "cert_file": "client_cert",
    "key_file": "client_key",
    "proxy": "proxy",
    "no_proxy": "no_proxy",
    "proxy_headers": "proxy_headers",
    "persist_config": "persist_config",
}

IMPERSONATE_HEADERS = {"impersonate_user": "Impersonate-User", "impersonate_groups": "Impersonate-Group"}

PROBE_TIMEOUT = 30  # seconds GET /version may take

_SECRET_KEYS = ("api_key", "password")


class K8sClientError(Exception):
    """No usable API client: ``str()`` is the message for the user (``<option>: ...; <fix>``), without secrets."""


#: The auth options that take a URL, and where their credentials go instead (``_http.refuse_url_credentials``).
URL_OPTIONS = {
    "host": "pass them as api_key, or username and password (both no_log)",
    "proxy": "pass them as proxy_headers.proxy_basic_auth (no_log)",
}


def argument_spec():
    """A copy of :data:`AUTH_ARG_SPEC` to ``update()`` a module's argument spec with."""
    return {k: dict(v, **({"options": dict(v["options"])} if "options" in v else {})) for k, v in AUTH_ARG_SPEC.items()}


def _env_bool(value):
    return value.lower() not in ("0", "false", "no")


def auth_settings(params, environ=None):
    """``(auth, sources)``: the settings by client name (``host``, ``api_key``, ``verify_ssl`` ...) from the
    module's params and the ``K8S_AUTH_*`` variables, and where each came from (the option or variable name)."""
    environ = os.environ if environ is None else environ
    auth, sources = {}, {}
    for true_name, arg_name in AUTH_ARG_MAP.items():
        if params.get(arg_name) is not None:
            auth[true_name], sources[true_name] = params[arg_name], arg_name
        elif arg_name == "proxy_headers":
            headers = {}
            for key in AUTH_PROXY_HEADERS_SPEC:
                var = "K8S_AUTH_PROXY_HEADERS_%s" % key.upper()
                if environ.get(var) is not None:
                    headers[key] = environ[var]
            if headers:
                auth[true_name], sources[true_name] = headers, "K8S_AUTH_PROXY_HEADERS_*"
        else:
            for var in ("K8S_AUTH_%s" % arg_name.upper(), "K8S_AUTH_%s" % true_name.upper()):
                if environ.get(var):  # kubernetes.core: os.getenv(a) or os.getenv(b)
                    value = environ[var]
                    auth[true_name] = _env_bool(value) if AUTH_ARG_SPEC[arg_name].get("type") == "bool" else value
                    sources[true_name] = var
                    break
    return auth, sources


def impersonation_headers(params, environ=None):
    """``{header: value or [values]}`` for ``impersonate_user`` / ``impersonate_groups`` (or their K8S_AUTH_ variables)."""
    environ = os.environ if environ is None else environ
    headers = {}
    for arg_name, header in IMPERSONATE_HEADERS.items():
        value = params.get(arg_name)
        if value is None:
            value = environ.get("K8S_AUTH_%s" % arg_name.upper())
            if value is not None and AUTH_ARG_SPEC[arg_name].get("type") == "list":
                value = [x for x in value.split(",") if x != ""]
        if value:
            headers[header] = value
    return headers


class _HeaderName(str):
    """A header name that is a distinct dict key each time, so one header can be sent several times
    (one ``Impersonate-Group`` per group, as kubernetes.core does)."""

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def lower(self):
        return _HeaderName(str.lower(self))


def _scrub(text, auth):
    """``text`` with every secret of ``auth`` replaced."""
    secrets = [auth.get(k) for k in _SECRET_KEYS]
    secrets += list((auth.get("proxy_headers") or {}).get(k) for k in ("proxy_basic_auth", "basic_auth"))
    for secret in secrets:
        if isinstance(secret, str) and secret:
            text = text.replace(secret, "********")
    return text


def _where(sources, name, default):
    return sources.get(name, default)


def configuration(params, environ=None):
    """``(Configuration, auth, sources)`` for ``params`` (a module's params with the auth options)."""
    import kubernetes  # pylint: disable=import-outside-toplevel

    auth, sources = auth_settings(params, environ)
    for name in ("ssl_ca_cert", "cert_file", "key_file"):
        path = auth.get(name)
        if path and not os.path.isfile(os.path.expanduser(path)):
            raise K8sClientError("%s: %s is not a file; point it at the PEM file (from %s)" % (
                AUTH_ARG_MAP[name], path, sources[name]))
    kubeconfig = auth.get("kubeconfig")
    if kubeconfig is not None and not isinstance(kubeconfig, (str, dict)):
        raise K8sClientError("kubeconfig: must be a path (several joined with %r) or a kubeconfig as a dict, not a %s"
                             % (os.pathsep, type(kubeconfig).__name__))
    if auth.get("host"):
        auth["host"] = auth["host"].rstrip("/")

    def given(*names):
        return all(auth.get(n) for n in names)

    cfg = kubernetes.client.Configuration()
    load = dict(context=auth.get("context"), client_configuration=cfg, persist_config=bool(auth.get("persist_config")))
    try:
        if given("username", "password", "host") or given("api_key", "host") or given("cert_file", "key_file", "host"):
            pass  # enough to authenticate: no kubeconfig is read
        elif given("kubeconfig") or given("context"):
            _load_kubeconfig(kubernetes, kubeconfig, load)
        else:
            try:
                kubernetes.config.load_incluster_config(client_configuration=cfg)
            except kubernetes.config.ConfigException:
                try:
                    _load_kubeconfig(kubernetes, None, load)
                except kubernetes.config.ConfigException as e:
                    if auth.get("host"):
                        raise
                    raise K8sClientError(
                        "host: no Kubernetes API to talk to (not in a pod, no kubeconfig: %s); set host and api_key "
                        "(K8S_AUTH_HOST, K8S_AUTH_API_KEY - what an AWX 'OpenShift or Kubernetes API Bearer Token' "
                        "credential sets) or kubeconfig (K8S_AUTH_KUBECONFIG)" % _scrub(str(e), auth)) from None
    except K8sClientError:
        raise
    except Exception as e:  # pylint: disable=broad-except  # kubeconfig problems surface as many exception types
        raise K8sClientError("%s: cannot create a Kubernetes API client: the kubeconfig (%s) cannot be loaded: %s: %s; "
                             "check the file and the context" % (
                                 "context" if "context" in str(e).lower() and auth.get("context") else "kubeconfig",
                                 "inline" if isinstance(kubeconfig, dict) else kubeconfig or "default",
                                 type(e).__name__, _scrub(str(e), auth))) from None

    for key, value in auth.items():
        if value is None or key in ("kubeconfig", "context", "persist_config"):
            continue
        if key == "api_key":
            cfg.api_key = {"authorization": "Bearer %s" % value}
        elif key == "proxy_headers":
            import urllib3  # pylint: disable=import-outside-toplevel

            cfg.proxy_headers = urllib3.util.make_headers(**value)
        else:
            setattr(cfg, key, value)
    if given("username", "password") and not auth.get("api_key"):
        cfg.api_key = {"authorization": cfg.get_basic_auth_token()}
    return cfg, auth, sources


def _load_kubeconfig(kubernetes, kubeconfig, load):
    if isinstance(kubeconfig, dict):
        kubernetes.config.load_kube_config_from_dict(config_dict=kubeconfig, **load)
    else:
        kubernetes.config.load_kube_config(config_file=kubeconfig, **load)


def api_client(params, environ=None, probe=True):
    """A ``kubernetes.client.ApiClient`` for a module's params (the auth options) and the ``K8S_AUTH_*`` environment.

    With ``probe``, ``GET /version`` is asked once: an API server that cannot be reached, a certificate that
    cannot be verified or a token the server rejects (401) raises :class:`K8sClientError` naming the option
    (or variable) to fix. Any other answer (even 403 or 404) means the server is there and the identity is known.
    """
    import kubernetes  # pylint: disable=import-outside-toplevel

    cfg, auth, sources = configuration(params, environ)
    if cfg.verify_ssl is False:  # chosen (validate_certs: false): no InsecureRequestWarning on every request
        import urllib3  # pylint: disable=import-outside-toplevel

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    api = kubernetes.client.ApiClient(cfg)
    for header, value in impersonation_headers(params, environ).items():
        for one in value if isinstance(value, list) else [value]:
            api.set_default_header(_HeaderName(header) if isinstance(value, list) else header, one)
    if probe:
        check_reachable(api, auth, sources)
    return api


def check_reachable(api, auth, sources):
    """Ask ``GET /version``; raise :class:`K8sClientError` for what makes every later request fail."""
    from kubernetes.client import VersionApi  # pylint: disable=import-outside-toplevel
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel

    host = api.configuration.host
    host_from = _where(sources, "host", "the kubeconfig's cluster server")
    try:
        VersionApi(api).get_code(_preload_content=False, _request_timeout=PROBE_TIMEOUT)
        return
    except ApiException as e:
        if e.status != 401:
            return  # answered: reachable, verified, and the credentials were not rejected
        if "api_key" in sources:
            opt, token = "api_key", "the bearer token (from %s)" % sources["api_key"]
        elif "username" in sources:
            opt, token = "username", "username/password (from %s/%s)" % (sources["username"], _where(sources, "password", "?"))
        else:
            opt, token = "kubeconfig", "the kubeconfig user's credentials"
        raise K8sClientError(
            "%s: cannot create a Kubernetes API client: the API server at %s rejected %s (401 Unauthorized on "
            "GET /version); renew the token or fix the credential (AWX: the 'API authentication bearer token' of "
            "the OpenShift or Kubernetes API Bearer Token credential)" % (opt, host, token)) from None
    except Exception as e:  # pylint: disable=broad-except  # urllib3/ssl/socket errors
        reason = getattr(e, "reason", None) or e
        text = _scrub("%s: %s" % (type(reason).__name__, reason), auth)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower() or "SSLCertVerification" in text:
            if auth.get("ssl_ca_cert"):
                fix = ("ca_cert (%s = %s) is not the CA that signed the API server's certificate, or the certificate "
                       "does not name %s; give the cluster's CA bundle" % (sources["ssl_ca_cert"], auth["ssl_ca_cert"], host))
            else:
                fix = ("give the cluster's CA bundle in ca_cert (K8S_AUTH_SSL_CA_CERT; AWX: the credential's "
                       "'Certificate Authority data'), or for a test cluster only validate_certs: false")
            raise K8sClientError("ca_cert: cannot create a Kubernetes API client: the certificate of the API server at "
                                 "%s cannot be verified (%s); %s" % (host, text, fix)) from None
        raise K8sClientError("%s: cannot create a Kubernetes API client: the API server at %s (from %s) does not answer "
                             "(%s); check the address and that it is reachable from where the module runs" % (
                                 "host" if "host" in sources else "kubeconfig", host, host_from, text)) from None
