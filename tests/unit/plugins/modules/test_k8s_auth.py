"""The Kubernetes modules authenticate the way kubernetes.core's do (options, K8S_AUTH_* variables, module_defaults).

A real API server stand-in on 127.0.0.1 (HTTPS with a CA made here, or HTTP) answers the paths the modules read
and refuses any request without the expected bearer token, like an API server does (401). Nothing here needs a
cluster.
"""
from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_client
from ansible_collections.llmops.serving.plugins.modules import engine_diagnose, k8s_engine_wait

pytest.importorskip("kubernetes")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIX = os.path.join(ROOT, "tests", "unit", "fixtures", "k8s")
with open(os.path.join(FIX, "pods.yaml")) as f:
    PODS = yaml.safe_load(f)
with open(os.path.join(FIX, "routes.yaml")) as f:
    ROUTES = yaml.safe_load(f)

TOKEN = "sha256~awx-injected-t0ken-1c9f"
ROUTE = "glm-5.2-fp8-vllm-router"
WAIT = dict(namespace="llm-lab", selector={"app.kubernetes.io/name": "glm-5-2-fp8-vllm"}, route_name=ROUTE,
            timeout=5, poll_interval=1, log_tail_lines=0)
AUTH_VARS = [v for v in os.environ if v.startswith("K8S_AUTH_")] + ["KUBECONFIG"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No K8S_AUTH_* or kubeconfig of the machine running the tests leaks in."""
    for var in AUTH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# ---- certificates --------------------------------------------------------------------------------


def _ca_and_server_cert(directory, name):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "%s-ca" % name)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {}
    for what, data in (("ca", ca.public_bytes(serialization.Encoding.PEM)),
                       ("cert", cert.public_bytes(serialization.Encoding.PEM)),
                       ("key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))):
        paths[what] = os.path.join(str(directory), "%s-%s.pem" % (name, what))
        with open(paths[what], "wb") as out:
            out.write(data)
    return paths


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    return {"cluster": _ca_and_server_cert(d, "cluster"), "other": _ca_and_server_cert(d, "other")}


# ---- the API server stand-in ---------------------------------------------------------------------

API_RESOURCES = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list", "watch"]}]}


class ApiServer:
    """Answers GET like kube-apiserver for a few paths; 401 to any request without ``Bearer <token>``."""

    def __init__(self, token=TOKEN, tls=None):
        self.token = token
        self.requests = []  # (path, Authorization header, [Impersonate-Group ...], Impersonate-User)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0].rstrip("/") or "/"  # the client asks /version/
                auth = self.headers.get("Authorization")
                outer.requests.append((path, auth, self.headers.get_all("Impersonate-Group") or [],
                                       self.headers.get("Impersonate-User")))
                if outer.token is not None and auth != "Bearer %s" % outer.token:
                    return self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
                if path == "/version":
                    return self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.1"})
                if path == "/api":
                    return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
                if path == "/apis":
                    return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
                if path == "/api/v1":
                    return self._send(200, API_RESOURCES)
                if path == "/api/v1/namespaces/llm-lab/pods":
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [PODS["ready"]]})
                if path.endswith("/namespaces/llm-lab/events") or path.endswith("/namespaces/llm-lab/services"):
                    return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
                if path == "/apis/gateway.networking.k8s.io/v1/namespaces/aibrix-system/httproutes/" + ROUTE:
                    return self._send(200, ROUTES["accepted"])
                return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                        "code": 404})

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls["cert"], tls["key"])
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = "%s://127.0.0.1:%d" % (scheme, self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self):
        return [r[0] for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def https_api(pki):
    srv = ApiServer(tls=pki["cluster"])
    yield srv
    srv.close()


@pytest.fixture
def http_api():
    srv = ApiServer()
    yield srv
    srv.close()


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _no_token(result):
    assert TOKEN not in json.dumps(result)


# ---- options -------------------------------------------------------------------------------------


def test_the_options_are_kubernetes_cores_auth_options():
    """Restated, not imported: the spec must stay what kubernetes.core.k8s_auth_options documents and validates."""
    from ansible_collections.kubernetes.core.plugins.module_utils import args_common

    assert _k8s_client.AUTH_ARG_SPEC == args_common.AUTH_ARG_SPEC
    assert _k8s_client.AUTH_ARG_MAP == args_common.AUTH_ARG_MAP
    assert _k8s_client.argument_spec()["api_key"]["no_log"] is True


def test_host_api_key_and_ca_cert_options_reach_the_server_over_verified_tls(run_module, https_api, pki):
    r = run_module(k8s_engine_wait, dict(WAIT, host=https_api.url + "/", api_key=TOKEN, ca_cert=pki["cluster"]["ca"]))
    assert not r.get("failed"), r
    assert r["state"] == "ready" and r["route"]["accepted"]
    assert {"/version", "/api/v1/namespaces/llm-lab/pods",
            "/apis/gateway.networking.k8s.io/v1/namespaces/aibrix-system/httproutes/" + ROUTE} <= set(https_api.paths())
    assert {auth for _p, auth, _g, _u in https_api.requests} == {"Bearer " + TOKEN}
    _no_token(r)


def test_awx_credential_environment_is_used_when_no_option_is_given(run_module, https_api, pki, monkeypatch):
    """What AWX's 'OpenShift or Kubernetes API Bearer Token' credential injects: host, token, verify, CA file."""
    monkeypatch.setenv("K8S_AUTH_HOST", https_api.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", TOKEN)
    monkeypatch.setenv("K8S_AUTH_VERIFY_SSL", "True")
    monkeypatch.setenv("K8S_AUTH_SSL_CA_CERT", pki["cluster"]["ca"])
    r = run_module(k8s_engine_wait, WAIT)
    assert not r.get("failed"), r
    assert r["state"] == "ready"
    assert {auth for _p, auth, _g, _u in https_api.requests} == {"Bearer " + TOKEN}
    _no_token(r)


def test_diagnose_reads_the_cluster_with_the_awx_credential_environment(run_module, https_api, pki, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_HOST", https_api.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", TOKEN)
    monkeypatch.setenv("K8S_AUTH_SSL_CA_CERT", pki["cluster"]["ca"])
    r = run_module(engine_diagnose, {"namespace": "llm-lab", "name": "glm-5-2-fp8-vllm"})
    assert not r.get("failed"), r
    assert "/api/v1/namespaces/llm-lab/pods" in https_api.paths() and "/api/v1/namespaces/llm-lab/events" in https_api.paths()
    assert {auth for _p, auth, _g, _u in https_api.requests} == {"Bearer " + TOKEN}
    _no_token(r)


def test_an_unverifiable_certificate_fails_naming_ca_cert_and_never_sends_the_token(run_module, https_api, pki, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_HOST", https_api.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", TOKEN)
    for extra in ({}, {"ca_cert": pki["other"]["ca"]}):
        r = run_module(k8s_engine_wait, dict(WAIT, **extra))
        assert r["failed"] and r["msg"].startswith("ca_cert: cannot create a Kubernetes API client: the certificate of "
                                                   "the API server at %s cannot be verified" % https_api.url), r["msg"]
        assert "CERTIFICATE_VERIFY_FAILED" in r["msg"]
        _no_token(r)
    assert "validate_certs: false" in run_module(k8s_engine_wait, WAIT)["msg"]
    assert https_api.requests == []  # the TLS handshake failed before any request (and its token) was sent


@pytest.mark.parametrize("value, verified", [("False", False), ("no", False), ("0", False), ("true", True)])
def test_k8s_auth_verify_ssl_is_read_as_kubernetes_core_reads_it(run_module, https_api, monkeypatch, value, verified):
    monkeypatch.setenv("K8S_AUTH_HOST", https_api.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", TOKEN)
    monkeypatch.setenv("K8S_AUTH_VERIFY_SSL", value)
    r = run_module(k8s_engine_wait, WAIT)
    if verified:
        assert r["failed"] and r["msg"].startswith("ca_cert:"), r
    else:
        assert not r.get("failed") and r["state"] == "ready", r


def test_an_explicit_option_beats_the_environment(run_module, https_api, pki, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_HOST", "http://127.0.0.1:%d" % _free_port())  # nothing listens there
    monkeypatch.setenv("K8S_AUTH_API_KEY", "stale-token-from-env")
    monkeypatch.setenv("K8S_AUTH_VERIFY_SSL", "no")
    r = run_module(k8s_engine_wait, dict(WAIT, host=https_api.url, api_key=TOKEN, validate_certs=True,
                                         ca_cert=pki["cluster"]["ca"]))
    assert not r.get("failed"), r
    assert {auth for _p, auth, _g, _u in https_api.requests} == {"Bearer " + TOKEN}
    # validate_certs=true given on the task wins over K8S_AUTH_VERIFY_SSL=no: without the CA it fails
    r = run_module(k8s_engine_wait, dict(WAIT, host=https_api.url, api_key=TOKEN, validate_certs=True))
    assert r["failed"] and r["msg"].startswith("ca_cert:")


def test_a_rejected_token_fails_naming_where_it_came_from_without_showing_it(run_module, http_api, monkeypatch):
    http_api.token = "the-token-the-cluster-wants"
    r = run_module(k8s_engine_wait, dict(WAIT, host=http_api.url, api_key=TOKEN))
    assert r["failed"] and r["msg"].startswith(
        "api_key: cannot create a Kubernetes API client: the API server at %s rejected the bearer token (from "
        "api_key) (401 Unauthorized on GET /version)" % http_api.url), r["msg"]
    _no_token(r)
    monkeypatch.setenv("K8S_AUTH_HOST", http_api.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", TOKEN)
    r = run_module(engine_diagnose, {"namespace": "llm-lab", "name": "glm"})
    assert r["failed"] and "rejected the bearer token (from K8S_AUTH_API_KEY)" in r["msg"], r["msg"]
    _no_token(r)
    assert http_api.paths() == ["/version", "/version"]  # nothing read after the refusal


def test_an_unreachable_host_fails_naming_host(run_module):
    url = "http://127.0.0.1:%d" % _free_port()
    r = run_module(k8s_engine_wait, dict(WAIT, host=url, api_key=TOKEN))
    assert r["failed"] and r["msg"].startswith("host: cannot create a Kubernetes API client: the API server at %s "
                                               "(from host) does not answer" % url), r["msg"]
    _no_token(r)


def test_no_configuration_at_all_says_what_to_set(run_module):
    r = run_module(k8s_engine_wait, WAIT)
    assert r["failed"] and r["msg"].startswith("host: no Kubernetes API to talk to"), r["msg"]
    assert "K8S_AUTH_HOST" in r["msg"] and "kubeconfig" in r["msg"]


def test_a_missing_ca_file_is_refused_before_connecting(run_module, http_api, tmp_path):
    r = run_module(k8s_engine_wait, dict(WAIT, host=http_api.url, api_key=TOKEN, ca_cert=str(tmp_path / "nope.pem")))
    assert r["failed"] and r["msg"].startswith("ca_cert: %s is not a file" % (tmp_path / "nope.pem")), r["msg"]
    assert http_api.requests == []


def test_impersonation_sends_one_header_per_group(run_module, http_api, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_IMPERSONATE_GROUPS", "sre,llm-operators")
    r = run_module(k8s_engine_wait, dict(WAIT, host=http_api.url, api_key=TOKEN, impersonate_user="awx-job"))
    assert not r.get("failed"), r
    assert {(tuple(groups), user) for _p, _a, groups, user in http_api.requests} == {(("sre", "llm-operators"), "awx-job")}


def test_a_kubeconfig_token_and_k8s_auth_kubeconfig(run_module, http_api, tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": http_api.url}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}],
        "users": [{"name": "lab", "user": {"token": TOKEN}}]}))
    monkeypatch.setenv("K8S_AUTH_KUBECONFIG", str(kubeconfig))
    r = run_module(k8s_engine_wait, WAIT)
    assert not r.get("failed"), r
    assert {auth for _p, auth, _g, _u in http_api.requests} == {"Bearer " + TOKEN}


def test_auth_settings_follow_kubernetes_core_precedence():
    env = {"K8S_AUTH_VALIDATE_CERTS": "no", "K8S_AUTH_VERIFY_SSL": "yes", "K8S_AUTH_CERT_FILE": "/c.pem",
           "K8S_AUTH_PROXY_HEADERS_USER_AGENT": "llmops/1", "K8S_AUTH_HOST": "https://env:6443"}
    auth, sources = _k8s_client.auth_settings({"host": "https://task:6443", "validate_certs": None}, env)
    assert auth["host"] == "https://task:6443" and sources["host"] == "host"
    assert auth["verify_ssl"] is False and sources["verify_ssl"] == "K8S_AUTH_VALIDATE_CERTS"  # the option's name first
    assert auth["cert_file"] == "/c.pem" and sources["cert_file"] == "K8S_AUTH_CERT_FILE"
    assert auth["proxy_headers"] == {"user_agent": "llmops/1"}


# ---- module_defaults through the action groups (ansible-playbook) --------------------------------


def test_module_defaults_of_the_groups_reach_the_modules(tmp_path, https_api, pki):
    """group/llmops.serving.k8s gives kubernetes.core.k8s_info and k8s_engine_wait one credential;
    group/llmops.serving.serving reaches k8s_engine_wait too. The token is never printed."""
    auth = {"host": https_api.url, "api_key": TOKEN, "ca_cert": pki["cluster"]["ca"]}
    wait = dict(WAIT, selector={"app.kubernetes.io/name": "glm-5-2-fp8-vllm"})
    out = tmp_path / "results.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([
        {"name": "One credential for kubernetes.core and llmops.serving", "hosts": "localhost", "gather_facts": False,
         "module_defaults": {"group/llmops.serving.k8s": auth},
         "tasks": [{"name": "List pods", "kubernetes.core.k8s_info": {"kind": "Pod", "namespace": "llm-lab"},
                    "register": "listed"},
                   {"name": "Wait", "llmops.serving.k8s_engine_wait": wait, "register": "waited_k8s"}]},
        {"name": "The serving group", "hosts": "localhost", "gather_facts": False,
         "module_defaults": {"group/llmops.serving.serving": auth},
         "tasks": [{"name": "Wait", "llmops.serving.k8s_engine_wait": wait, "register": "waited_serving"},
                   {"name": "Save", "ansible.builtin.copy": {
                       "dest": str(out), "mode": "0600",
                       "content": "{{ {'listed': listed.resources | map(attribute='metadata.name') | list, "
                                  "'k8s': waited_k8s.state, 'serving': waited_serving.state} | to_json }}"}}]}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("K8S_AUTH_") and k != "KUBECONFIG"}
    env.update(ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), HOME=str(tmp_path), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               # kubernetes.core keeps its discovery in $TMPDIR/k8srcp-<sha256(host-uid)>.json: an earlier run's file
               # for the same 127.0.0.1 port would answer it, and the discovery asserted below would never be asked
               TMPDIR=str(tmp_path))
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-v", "-i", "localhost,",
                           "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=180, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert json.loads(out.read_text()) == {"listed": [PODS["ready"]["metadata"]["name"]], "k8s": "ready", "serving": "ready"}
    assert https_api.paths().count("/apis/gateway.networking.k8s.io/v1/namespaces/aibrix-system/httproutes/" + ROUTE) == 2
    assert "/api/v1" in https_api.paths()  # kubernetes.core's discovery, with the same credential
    assert {a for _p, a, _g, _u in https_api.requests} == {"Bearer " + TOKEN}
    assert TOKEN not in output
