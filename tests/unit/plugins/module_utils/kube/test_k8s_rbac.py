"""The automation's two Kubernetes identities cover every API call the collection makes, and no more.

Three sources are compared with ``_k8s_rbac.ACCESS``:

* the requests k8s_engine_wait and engine_diagnose send, recorded on a stand-in API server through the real
  kubernetes client, each turned into (verb, apiGroup, resource, namespace) as the API server does
  (``k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``);
* every kubernetes client call in plugins/ (an AST scan), so a call no recording exercises still needs a rule;
* every kind the roles apply, read or delete with kubernetes.core (their task files) and every object the
  renderers build (dict literals with a constant apiVersion and kind in plugins/module_utils).

A new call or kind without a rule fails here, and a rule no call needs fails too (least privilege).
"""
from __future__ import annotations

import ast
import email.utils
import http.server
import json
import os
import re
import threading
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.filter import k8s_rbac as rbac_filter
from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_k8s, _k8s_client
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_rbac as rbac
from ansible_collections.llmops.serving.plugins.modules import k8s_engine_wait
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import K8S_VERSION, ROOT

NS, GW = "llm-lab", "aibrix-system"
K8S_MODULES = ("kubernetes.core.k8s", "kubernetes.core.k8s_info", "kubernetes.core.k8s_log")
#: objects the renderers build that are never sent to the API server (with the file that writes them)
NOT_APPLIED = {"Kustomization": "plugins/module_utils/kube/_render_dir.py (kustomization.yaml)",
               "ClusterRole": "plugins/module_utils/kube/_k8s_rbac.py (applied by a cluster administrator)",
               "ClusterRoleBinding": "plugins/module_utils/kube/_k8s_rbac.py (applied by a cluster administrator)"}


# ------------------------------------------------------------------------------------------------ #
# The rendered objects
# ------------------------------------------------------------------------------------------------ #


@pytest.mark.parametrize("gateway", [GW, NS])
def test_rendered_rbac_validates_and_binds_each_identity(gateway):
    objects = rbac.rbac_objects(NS, gateway)
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    names = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}
    assert ("ServiceAccount", NS, "llmops-deploy") in names and ("ServiceAccount", NS, "llmops-read") in names
    assert ("Role", gateway, "llmops-deploy") in names and ("RoleBinding", gateway, "llmops-read") in names
    assert ("ClusterRole", None, "llmops-deploy-" + NS) in names
    assert not any(o["kind"] == "ClusterRole" and o["metadata"]["name"].startswith("llmops-read") for o in objects)
    for binding in (o for o in objects if o["kind"].endswith("Binding")):
        role = [o for o in objects if o["kind"] == binding["roleRef"]["kind"]
                and o["metadata"]["name"] == binding["roleRef"]["name"]
                and o["metadata"].get("namespace") == binding["metadata"].get("namespace")]
        assert role, binding
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": binding["metadata"]["name"].replace("-" + NS, ""),
                                        "namespace": NS}]


def test_the_read_identity_writes_nothing():
    for where in (rbac.NAMESPACE, rbac.GATEWAY, rbac.CLUSTER):
        for rule in rbac.rules(rbac.READ, where):
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    assert rbac.allows(rbac.rules(rbac.READ, rbac.NAMESPACE), "get", "", "pods/log")
    assert not rbac.allows(rbac.rules(rbac.READ, rbac.NAMESPACE), "create", "apps", "deployments")
    assert not rbac.allows(rbac.rules(rbac.READ, rbac.GATEWAY), "patch", "gateway.networking.k8s.io", "httproutes")


def test_the_deploy_identity_holds_every_rule_of_the_read_identity():
    for where in (rbac.NAMESPACE, rbac.GATEWAY):
        deploy = rbac.rules(rbac.DEPLOY, where)
        for rule in rbac.rules(rbac.READ, where):
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert rbac.allows(deploy, verb, rule["apiGroups"][0], resource), (where, resource, verb)
    # the P/D router's Role grants get/list/watch on pods: the deploy identity must hold them to create it
    pd_router = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    for verb in pd_router["verbs"]:
        assert rbac.allows(rbac.rules(rbac.DEPLOY, rbac.NAMESPACE), verb, "", "pods")


@pytest.mark.parametrize("names, option", [
    ({"deploy": "same", "read": "same"}, "names"),
    ({"deploy": ""}, "names.deploy"),
    ({"admin": "x"}, "names"),
])
def test_bad_names_are_refused_naming_the_option(names, option):
    with pytest.raises(ValueError, match=r"^%s: " % re.escape(option)):
        rbac.rbac_objects(NS, GW, names)


def test_the_filter_refuses_an_empty_namespace_naming_it():
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="k8s_rbac: namespace: "):
        rbac_filter.k8s_rbac("", GW)
    assert rbac_filter.k8s_rbac(NS, GW, "ci-deploy")[0]["metadata"]["name"] == "ci-deploy"


# ------------------------------------------------------------------------------------------------ #
# The requests the wait and the diagnosis send (a recording API server, the real client)
# ------------------------------------------------------------------------------------------------ #

_POD = {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "glm-0", "namespace": NS, "uid": "u1", "creationTimestamp": "2026-08-02T08:00:05Z",
                     "labels": {"app.kubernetes.io/name": "glm"}},
        "spec": {"containers": [{"name": "engine", "image": "x"}]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "engine", "ready": False, "restartCount": 1, "image": "x", "imageID": "", "started": False,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-08-02T08:00:10Z",
                                         "finishedAt": "2026-08-02T08:01:10Z"}}}]}}
_ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
          "metadata": {"name": "glm-router", "namespace": GW},
          "spec": {"rules": [{"backendRefs": [{"name": "glm", "namespace": NS, "port": 8000}]}]}}


class _RecordingApiServer:
    """Answers every GET (a list with the one pod for pods, the route by name, a log for ``/log``, an empty list or
    a named object otherwise) and records each request's method and path."""

    def __init__(self):
        outer = self
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body, ctype="application/json"):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Date", email.utils.formatdate(usegmt=True))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urlparse(self.path)
                outer.requests.append(("GET", url.path, parse_qs(url.query)))
                parts = url.path.strip("/").split("/")
                if url.path.rstrip("/") == "/version":
                    return self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
                if url.path.endswith("/log"):
                    return self._send(200, b"Traceback\nRuntimeError: boom\n", "text/plain")
                if url.path.endswith("/httproutes/glm-router"):
                    return self._send(200, _ROUTE)
                if parts[-1] == "pods":
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [_POD]})
                info = request_info("GET", url.path)
                if info["name"]:
                    return self._send(200, {"kind": "X", "apiVersion": "v1",
                                            "metadata": {"name": info["name"], "namespace": info["namespace"],
                                                         "generation": 1},
                                            "spec": {"replicas": 1}, "status": {}})
                return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def request_info(method, path):
    """``{verb, group, resource, namespace, name}`` of a resource request, as the API server's RequestInfoFactory
    (requestinfo.go) derives them: ``/api/v1/...`` is the core group, ``/apis/<group>/<version>/...`` a named
    group; ``namespaces/<ns>/`` scopes it; a GET with a name is ``get``, without one ``list``; a path segment after
    the name is a subresource (``pods/log``)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise AssertionError("not a resource request: %s" % path)
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"GET": "get" if name else "list", "POST": "create", "PATCH": "patch", "PUT": "update",
            "DELETE": "delete"}[method]
    return dict(verb=verb, group=group, resource=resource, namespace=namespace, name=name)


def _wait_params(srv, kind, name):
    params = {k: None for k in _k8s_client.AUTH_ARG_SPEC}
    params.update(host=srv.url, api_key="t0ken", namespace=NS, selector={"app.kubernetes.io/name": "glm"},
                  route_name="glm-router", gateway_namespace=GW, workload_kind=kind, workload_name=name,
                  service_name=None, log_tail_lines=100, models_url=None)
    return params


@pytest.fixture(scope="module")
def recorded():
    """Every request the wait (each workload kind, with a log read) and the diagnosis send."""
    pytest.importorskip("kubernetes")
    srv = _RecordingApiServer()
    try:
        for kind in ("Deployment", "LeaderWorkerSet", "StormService"):
            fetch = k8s_engine_wait.make_fetch(_wait_params(srv, kind, "glm"))
            fetch()
            assert fetch.read_log("glm-0", "engine", True) is not None
        api = _k8s_client.api_client(_wait_params(srv, "Deployment", "glm"))
        objects, logs, kinds, dummy = _diagnose_k8s.fetch_kubernetes(api, NS, "glm", GW)
        assert "Pod" in kinds
        return [r for r in srv.requests if r[1].rstrip("/") != "/version"]
    finally:
        srv.close()


def test_every_request_of_the_wait_and_the_diagnosis_is_allowed_to_the_read_identity(recorded):
    seen = set()
    for method, path, _query in recorded:
        info = request_info(method, path)
        where = {NS: rbac.NAMESPACE, GW: rbac.GATEWAY}.get(info["namespace"], rbac.CLUSTER)
        assert rbac.allows(rbac.rules(rbac.READ, where), info["verb"], info["group"], info["resource"]), (
            "%s %s (%s %s/%s in %s) has no rule of the read identity: add it to _k8s_rbac.ACCESS"
            % (method, path, info["verb"], info["group"], info["resource"], where))
        seen.add((info["group"], info["resource"]))
    # the recording exercised what the review listed as read (a stand-in that read nothing would pass the loop)
    for needed in [("", "pods"), ("", "pods/log"), ("", "events"), ("", "services"), ("apps", "replicasets"),
                   ("apps", "statefulsets"), ("apps", "deployments"), ("discovery.k8s.io", "endpointslices"),
                   ("gateway.networking.k8s.io", "httproutes"), ("gateway.networking.k8s.io", "referencegrants"),
                   ("orchestration.aibrix.ai", "rolesets"), ("orchestration.aibrix.ai", "stormservices"),
                   ("leaderworkerset.x-k8s.io", "leaderworkersets")]:
        assert needed in seen, needed


def test_the_request_mapping_restates_requestinfo():
    assert request_info("GET", "/api/v1/namespaces/a/pods/p/log") == dict(
        verb="get", group="", resource="pods/log", namespace="a", name="p")
    assert request_info("GET", "/apis/apps/v1/namespaces/a/replicasets")["verb"] == "list"
    assert request_info("GET", "/api/v1/nodes") == dict(verb="list", group="", resource="nodes", namespace=None, name=None)
    assert request_info("PATCH", "/apis/gateway.networking.k8s.io/v1/namespaces/g/httproutes/r")["verb"] == "patch"


# ------------------------------------------------------------------------------------------------ #
# Every kubernetes client call in plugins/ (a call the recording does not exercise still needs a rule)
# ------------------------------------------------------------------------------------------------ #

#: typed kubernetes client methods -> (verb, apiGroup, resource)
_TYPED = {
    "list_namespaced_pod": ("list", "", "pods"), "read_namespaced_pod_log": ("get", "", "pods/log"),
    "list_namespaced_event": ("list", "", "events"), "list_namespaced_service": ("list", "", "services"),
    "read_namespaced_deployment": ("get", "apps", "deployments"),
    "list_namespaced_deployment": ("list", "apps", "deployments"),
    "list_namespaced_replica_set": ("list", "apps", "replicasets"),
    "list_namespaced_stateful_set": ("list", "apps", "statefulsets"),
    "list_namespaced_endpoint_slice": ("list", "discovery.k8s.io", "endpointslices"),
}
_CUSTOM = {"get_namespaced_custom_object": "get", "list_namespaced_custom_object": "list"}
_CLIENT_CALL = re.compile(r"^(list|read|get|create|patch|replace|delete|connect)_(namespaced_|cluster_custom)\w*$|"
                          r"^(list|read|create|patch|replace|delete)_(node|namespace|persistent_volume|cluster_role\w*)$|"
                          r"_for_all_namespaces$")


def _plugin_files():
    for base, _dirs, files in os.walk(os.path.join(ROOT, "plugins")):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(base, name)


def _str_tuples(tree):
    """(group, plural) of every tuple/list of string constants shaped like (..., group, version, plural)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List)):
            values = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]
            for i in range(len(values) - 2):
                group, version, plural = values[i:i + 3]
                if group and version and plural and "." in group and re.match(r"^v\d+(alpha|beta)?\d*$", version):
                    found.add((group, plural))
    return found


def _constants_in_order(node):
    """The string constants of a call's arguments or a tuple's elements, depth first, in source order."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    children = node.args + [k.value for k in node.keywords] if isinstance(node, ast.Call) else \
        node.elts if isinstance(node, (ast.Tuple, ast.List)) else []
    return [c for child in children for c in _constants_in_order(child)]


def _group_plural(constants):
    """(group, plural) of ``[..., group, version, (namespace,) plural, ...]`` or None."""
    for i, value in enumerate(constants[:-2]):
        if "." in value and re.match(r"^v\d+(alpha|beta)?\d*$", constants[i + 1]):
            plural = next((c for c in constants[i + 2:] if re.match(r"^[a-z]+$", c)), None)
            return (value, plural) if plural else None
    return None


def test_every_kubernetes_client_call_in_plugins_has_a_read_rule():
    """Every kubernetes client method named in plugins/ (called, or passed to a reader as the wait and the diagnosis
    do) maps to a rule of the read identity; a custom-object read names its group and plural as constants there or
    in the file's table of workload APIs."""
    calls = 0
    for path in _plugin_files():
        with open(path) as f:
            tree = ast.parse(f.read())
        tables = _str_tuples(tree)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _CLIENT_CALL.search(node.attr)):
                continue
            calls += 1
            where = "%s:%d %s" % (os.path.relpath(path, ROOT), node.lineno, node.attr)
            if node.attr in _TYPED:
                verb, group, resource = _TYPED[node.attr]
                assert rbac.allows(rbac.rules(rbac.READ, rbac.NAMESPACE), verb, group, resource), where
                continue
            assert node.attr in _CUSTOM, (
                "%s: a kubernetes client call this test does not know; map it in _TYPED and give it a rule in "
                "_k8s_rbac.ACCESS" % where)
            parent = parents.get(node)
            pair = _group_plural(_constants_in_order(parent)) if parent is not None else None
            pairs = {pair} if pair else tables  # else (group, version, plural) from the file's workload table
            assert pairs, "%s: cannot tell which resource it reads; pass group/version/plural as constants" % where
            for group, plural in pairs:
                allowed = any(rbac.allows(rbac.rules(rbac.READ, w), _CUSTOM[node.attr], group, plural)
                              for w in (rbac.NAMESPACE, rbac.GATEWAY))
                assert allowed, "%s reads %s/%s: add a read rule to _k8s_rbac.ACCESS" % (where, group, plural)
    assert calls >= 15  # the wait's and the diagnosis' reads were found (a scan that finds none proves nothing)


# ------------------------------------------------------------------------------------------------ #
# What the roles apply, read and delete with kubernetes.core, and what the renderers build
# ------------------------------------------------------------------------------------------------ #


def _tasks(items):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def role_k8s_tasks():
    """``(file, module, task)`` of every kubernetes.core task in roles/ and playbooks/."""
    found = []
    for top in ("roles", "playbooks"):
        for base, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if not name.endswith((".yml", ".yaml")) or "/molecule/" in base + "/":
                    continue
                path = os.path.join(base, name)
                with open(path) as f:
                    try:
                        data = yaml.safe_load(f)
                    except yaml.YAMLError:
                        continue
                plays = data if isinstance(data, list) else []
                items = [t for p in plays if isinstance(p, dict)
                         for key in ("tasks", "pre_tasks", "post_tasks", "handlers") for t in (p.get(key) or [])]
                for task in _tasks(items + [p for p in plays if isinstance(p, dict) and "hosts" not in p]):
                    for module in K8S_MODULES:
                        if module in task:
                            found.append((os.path.relpath(path, ROOT), module, task))
    return found


def _literal_kinds(task, module):
    """The kinds a task names literally: ``kind:``, or its loop's items (``{kind: ...}`` or plain kind names, or
    ``'kind': '...'`` inside a Jinja expression)."""
    args = task[module] or {}
    kind = args.get("kind")
    if isinstance(kind, str) and "{{" not in kind:
        return [kind]
    loop = task.get("loop", task.get("with_items"))
    if isinstance(loop, list):
        return [i.get("kind") if isinstance(i, dict) else i for i in loop if isinstance(i, (dict, str))]
    if isinstance(loop, str):
        return re.findall(r"""['"]kind['"]\s*:\s*['"](\w+)['"]""", loop)
    return []


def _rendered_kinds():
    """Kinds of the dict literals with a constant ``apiVersion`` and ``kind`` in plugins/module_utils."""
    kinds = {}
    for path in _plugin_files():
        if "/module_utils/" not in path:
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
                if "apiVersion" in keys and "kind" in keys:
                    value = node.values[keys.index("kind")]
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        kinds.setdefault(value.value, os.path.relpath(path, ROOT))
    return kinds


def _deploy_allows(verb, kind, scope=None):
    """Whether the deploy identity may ``verb`` a ``kind`` in ``scope`` (default: the gateway namespace for an
    HTTPRoute, else the engine namespace)."""
    group, resource, _namespaced = rbac.KINDS[kind]
    scope = scope or (rbac.GATEWAY if kind == "HTTPRoute" else rbac.NAMESPACE)
    return rbac.allows(rbac.rules(rbac.DEPLOY, scope), verb, group, resource)


def _task_scope(args):
    """Where a task's request goes: all namespaces without ``namespace``, the gateway's when it names it."""
    namespace = args.get("namespace")
    if namespace is None:
        return rbac.CLUSTER
    return rbac.GATEWAY if "gateway_namespace" in str(namespace) else rbac.NAMESPACE


def test_every_kind_the_roles_touch_has_a_deploy_rule():
    used = set()
    tasks = role_k8s_tasks()
    assert len(tasks) >= 10, tasks  # the roles' applies, reads and deletes were found
    for path, module, task in tasks:
        args = task[module] or {}
        where = "%s: %s" % (path, task.get("name"))
        if module == "kubernetes.core.k8s_log":
            assert _deploy_allows("list", "Pod") and _deploy_allows("get", "Pod")
            assert rbac.allows(rbac.rules(rbac.DEPLOY, rbac.NAMESPACE), "get", "", "pods/log"), where
            used.update({("", "pods"), ("", "pods/log")})
            continue
        kinds = _literal_kinds(task, module)
        scope = _task_scope(args)
        if module == "kubernetes.core.k8s_info":
            verbs = ("get", "list")
        elif str(args.get("state", "present")) == "absent":
            verbs = ("delete",)
        else:
            verbs = ("get", "create", "patch")
        if "definition" in args or "{{" in str(args.get("state", "")):
            verbs = ("get", "create", "patch", "delete")  # what a renderer built; state present or absent
        for kind in kinds:
            assert kind in rbac.KINDS, "%s: kind %s is not in _k8s_rbac.KINDS; add it and its rule" % (where, kind)
            for verb in verbs:
                assert _deploy_allows(verb, kind, scope), (
                    "%s: %s %s has no rule of the deploy identity: add it to _k8s_rbac.ACCESS" % (where, verb, kind))
            used.add(rbac.KINDS[kind][:2])
    for kind, path in sorted(_rendered_kinds().items()):
        if kind in NOT_APPLIED:
            continue
        assert kind in rbac.KINDS, "%s renders %s: add it to _k8s_rbac.KINDS and a deploy rule" % (path, kind)
        for verb in ("get", "create", "patch", "delete"):
            assert _deploy_allows(verb, kind), "%s renders %s: no %s rule for the deploy identity" % (path, kind, verb)
        used.add(rbac.KINDS[kind][:2])
    # least privilege: every write rule is for something the roles apply or delete
    for who, where, group, resources, verbs, _why in rbac.ACCESS:
        if who == rbac.DEPLOY and where != rbac.CLUSTER:
            for resource in resources:
                assert (group, resource) in used, "%s/%s has a deploy rule no role needs" % (group, resource)


def test_every_rule_is_needed_by_a_call_or_a_kind(recorded):
    needed = {(request_info(m, p)["group"], request_info(m, p)["resource"]) for m, p, _q in recorded}
    needed |= {rbac.KINDS[k][:2] for k in _rendered_kinds() if k in rbac.KINDS}
    for _path, module, task in role_k8s_tasks():
        needed |= {rbac.KINDS[k][:2] for k in _literal_kinds(task, module) if k in rbac.KINDS}
    for _who, _where, group, resources, _verbs, _why in rbac.ACCESS:
        for resource in resources:
            assert (group, resource) in needed, "%s/%s: a rule no call or kind needs; drop it" % (group, resource)


# ------------------------------------------------------------------------------------------------ #
# The README's namespace step: the Pod Security level and the quota the rendered pods need
# ------------------------------------------------------------------------------------------------ #


def _readme_namespace_step():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("2. **Create the namespace")
    return text[start:text.index("\n3. ", start)]


def test_readme_namespace_step_names_the_privileged_level_the_rendered_pods_need():
    step = _readme_namespace_step()
    assert "pod-security.kubernetes.io/enforce=privileged" in step
    assert "requests.nvidia.com/gpu" in step and "FailedCreate" in step
    assert "engine_k8s_render_rbac" in step
    # the statement stays true: the engine pod mounts hostPath volumes, which the baseline level forbids
    # (Pod Security Standards, https://kubernetes.io/docs/concepts/security/pod-security-standards/ "HostPath
    # Volumes": spec.volumes[*].hostPath must be undefined)
    built = _k8s_engine.build(dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace=NS,
                                   model_path="/mnt/nvme/models/GLM-5.2-FP8/3f2a9c1",
                                   image="vllm/vllm-openai:v0.26.0@sha256:" + "d" * 64,
                                   kernel_cache_dir="/mnt/nvme/kernel-cache/abc"))
    pods = [o["spec"]["template"]["spec"] for o in built["objects"] if o["kind"] == "Deployment"]
    assert pods, built["objects"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pods[0].get("volumes", []) if v.get("hostPath")}
    assert host_paths == {"model": "/mnt/nvme/models/GLM-5.2-FP8/3f2a9c1", "kernel-cache": "/mnt/nvme/kernel-cache/abc"}


def test_the_docs_name_the_rendered_identities():
    for doc in ("README.md", os.path.join("docs", "awx.md"), os.path.join("roles", "engine", "README.md")):
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for name in rbac.DEFAULT_NAMES.values():
            assert name in text, (doc, name)
