# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stand-in Kubernetes API server on loopback for the engine role's apply, wait and diagnose, with the test models
of tests/lib as its controllers. It records every request (method, path, query, Authorization, client address, time
and the status it answered).

What it serves, restated from upstream (kubernetes/kubernetes at tag v1.33.0 unless named otherwise):

* Discovery (https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api, unaggregated form;
  ``staging/src/k8s.io/apiserver/pkg/endpoints/discovery/legacy.go``, ``root.go``, ``group.go``, ``version.go``):
  ``GET /api`` (APIVersions), ``GET /apis`` (APIGroupList, each group's versions and preferredVersion),
  ``GET /api/v1`` and ``GET /apis/<group>/<version>`` (APIResourceList: name, singularName, namespaced, kind,
  verbs; subresources such as ``pods/log`` as ``<resource>/<sub>``), ``GET /version``. Only :data:`RESOURCES`
  exist; any other group/version answers 404, as an API server without that CRD does.
* Objects (``staging/src/k8s.io/apiserver/pkg/endpoints/handlers``): ``GET`` of a collection (namespaced or all
  namespaces) with ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``:
  ``staging/src/k8s.io/apimachinery/pkg/labels/selector.go``) and ``fieldSelector`` (``=``, ``==``, ``!=`` on
  dotted paths); a list's items carry no kind/apiVersion (the typed List does). ``GET``/``PUT``/``PATCH``/``DELETE``
  of a name, 404 ``NotFound`` with the API's message (``deployments.apps "x" not found``); ``POST`` creates,
  409 ``AlreadyExists`` when the name is taken, 400 when the body's kind or namespace does not match the URL;
  ``dryRun=All`` validates and answers without storing. ``metadata.generation`` starts at 1 and goes up when the
  spec changes; ``resourceVersion``/``uid``/``creationTimestamp`` are the server's.
* PATCH as kubernetes.core.k8s applies (kubernetes.core 6.2.0 ``plugins/module_utils/apply.py`` ``apply_object`` /
  ``k8s_apply``: GET, then POST with the last-applied annotation when absent, else a
  ``application/merge-patch+json`` PATCH): JSON merge patch (RFC 7386). ``strategic-merge-patch+json`` is applied
  as a merge patch too (lists are replaced, not merged by key); ``json-patch+json`` and server-side apply
  (``apply-patch+yaml``) answer 415.
* ``GET pods/<name>/log``: empty (the engines here print nothing); ``previous=true`` answers 400 as the kubelet does
  when no container ended.
* Authentication: every request but ``/version``, ``/healthz``, ``/livez``, ``/readyz`` (the
  ``system:public-info-viewer`` paths) needs ``Authorization: Bearer <token>``, else 401.

The controllers run in simulated time that follows the wall clock (each request first lets the seconds since the
last one pass): tests/lib/kube_controllers.py's Deployment and ReplicaSet controllers and kubelet make the
ReplicaSet (``pod-template-hash``), the pods, their start and their Ready condition; the scheduler is
tests/lib/kube_scheduler.py's filters (node affinity and selector, taints, resources, anti-affinity) over
:attr:`KubeAPI.nodes`, a pod that fits nowhere stays Pending with a ``FailedScheduling`` event, a pod whose
``hostPath`` (type Directory) is not on its node stays ContainerCreating with ``FailedMount`` (the test says which
directories each node has: ``has_dir``). HTTPRoutes get ``status.parents`` with the ``Accepted``/``ResolvedRefs``
conditions that tests/lib/aibrix_oracle.py's ``route_conditions`` gives (backend Service, ReferenceGrant); every
Service with a selector has one EndpointSlice of its pods (``_endpointslices``), pods get an address when scheduled.

What it does not do: watches (``watch=true`` answers 405), server-side apply, admission and schema validation,
RBAC (one token sees everything), owner-reference garbage collection, workloads other than Deployments (a
LeaderWorkerSet or StormService is stored but nothing runs it), namespaces other than ``namespace`` for
Deployments, TLS (plain HTTP on 127.0.0.1: only this process's network namespace reaches it). :class:`Gateway` is
the AIBrix gateway in front of it: tests/lib/aibrix_oracle.py's route table over the stored objects and the Ready
pods, the engines answering ``answer``.
"""
from __future__ import annotations

import copy
import http.server
import json
import re
import threading
import time
import uuid
from urllib.parse import parse_qs, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.tests.lib import aibrix_oracle
from ansible_collections.llmops.serving.tests.lib import kube_controllers
from ansible_collections.llmops.serving.tests.lib import kube_scheduler

READ = ["get", "list", "watch"]
ALL = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

# (group, version, plural, kind, namespaced, verbs)
RESOURCES = [
    ("", "v1", "namespaces", "Namespace", False, READ),
    ("", "v1", "nodes", "Node", False, READ),
    ("", "v1", "pods", "Pod", True, READ + ["delete"]),
    ("", "v1", "pods/log", "Pod", True, ["get"]),
    ("", "v1", "services", "Service", True, ALL),
    ("", "v1", "endpoints", "Endpoints", True, READ),
    ("", "v1", "events", "Event", True, READ),
    ("", "v1", "configmaps", "ConfigMap", True, ALL),
    ("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, READ),
    ("apps", "v1", "deployments", "Deployment", True, ALL),
    ("apps", "v1", "replicasets", "ReplicaSet", True, READ),
    ("apps", "v1", "statefulsets", "StatefulSet", True, ALL),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ALL),
    ("gateway.networking.k8s.io", "v1", "gateways", "Gateway", True, READ),
    ("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute", True, ALL),
    ("gateway.networking.k8s.io", "v1beta1", "referencegrants", "ReferenceGrant", True, ALL),
]
PUBLIC = ("/version", "/healthz", "/livez", "/readyz")
# the objects the controllers own: read from the controller model, written only through Deployments
CONTROLLED = {("", "pods"), ("", "events"), ("apps", "deployments"), ("apps", "replicasets")}
GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"


def _resource(group, version, plural):
    for r in RESOURCES:
        if r[:3] == (group, version, plural):
            return r
    return None


def _group_version(group, version):
    return version if not group else "%s/%s" % (group, version)


def _status(code, reason, message, details=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return code, body


def _qualified(group, plural):
    return plural if not group else "%s.%s" % (plural, group)


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# ---- selectors (k8s.io/apimachinery pkg/labels/selector.go, pkg/fields/selector.go) ----------------------------

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_requirements(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def label_matcher(text):
    """A predicate over a labels dict; ValueError for a selector the API would refuse."""
    reqs = []
    for part in _split_requirements(text or ""):
        m = _SET_RE.match(part)
        if m:
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            reqs.append((m.group(1), m.group(2), values))
            continue
        part = part.strip()
        for op in ("!=", "==", "="):
            if op in part:
                key, value = part.split(op, 1)
                reqs.append((key.strip(), "!=" if op == "!=" else "=", {value.strip()}))
                break
        else:
            if part.startswith("!"):
                reqs.append((part[1:].strip(), "!", set()))
            elif re.match(r"^[A-Za-z0-9./_-]+$", part):
                reqs.append((part, "exists", set()))
            else:
                raise ValueError("unable to parse requirement: %r" % part)

    def match(labels):
        labels = labels or {}
        for key, op, values in reqs:
            has = key in labels
            if op == "=" and not (has and labels[key] in values):
                return False
            if op == "!=" and has and labels[key] in values:
                return False
            if op == "in" and not (has and labels[key] in values):
                return False
            if op == "notin" and has and labels[key] in values:
                return False
            if op == "exists" and not has:
                return False
            if op == "!" and has:
                return False
        return True
    return match


def field_matcher(text):
    reqs = []
    for part in [p for p in (text or "").split(",") if p.strip()]:
        for op in ("!=", "==", "="):
            if op in part:
                key, value = part.split(op, 1)
                reqs.append((key.strip().split("."), op != "!=", value.strip()))
                break
        else:
            raise ValueError("invalid field selector: %r" % part)

    def get(obj, path):
        for p in path:
            obj = obj.get(p) if isinstance(obj, dict) else None
        return "" if obj is None else str(obj)

    return lambda obj: all((get(obj, path) == value) == equal for path, equal, value in reqs)


# ---- the controllers ----------------------------------------------------------------------------------------------

class _Controllers(kube_controllers.Cluster):
    """kube_controllers' Deployment/ReplicaSet controllers and kubelet, with kube_scheduler's filters placing pods."""

    def __init__(self, namespace, nodes, has_dir, engine, start):
        super().__init__(namespace=namespace, nodes=[n["name"] for n in nodes], start=start, pull_seconds=1,
                         terminate_seconds=1)
        self.sched_nodes = nodes
        self.has_dir = has_dir
        self.engine = engine

    def _engine_of(self, pod):
        """The model path of the rendered command and the stand-in engine serving it."""
        path = kube_controllers.model_path(pod)
        return path, self.engines.get(path) or self.engine

    def _scheduler_event(self, pod, etype, reason, message):
        self.events.append({
            "apiVersion": "v1", "kind": "Event", "type": etype, "reason": reason, "message": message, "count": 1,
            "metadata": {"name": "%s.%x" % (pod["metadata"]["name"], len(self.events)), "namespace": self.ns},
            "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": self.ns,
                               "uid": pod["metadata"]["uid"]},
            "firstTimestamp": self._iso(), "lastTimestamp": self._iso(), "source": {"component": "default-scheduler"}})

    def _schedule(self, pod):
        for n in self.sched_nodes:
            n["pods"] = [(p["metadata"].get("labels") or {}, self.ns, p["spec"]) for p in self.pods.values()
                         if p is not pod and p["spec"].get("nodeName") == n["name"]]
        entry = ("Pod/" + pod["metadata"]["name"], pod["metadata"].get("labels") or {}, self.ns, pod["spec"])
        fits = sorted(kube_scheduler.feasible(entry, self.sched_nodes))
        x = pod.setdefault("x", {})
        if not fits:
            why = sorted({r for n in self.sched_nodes for r in kube_scheduler.reasons(entry, n, self.sched_nodes)})
            msg = "0/%d nodes are available: %s." % (len(self.sched_nodes), ", ".join(why))
            cond = self._cond(pod, "PodScheduled")
            cond.update(status="False", reason="Unschedulable", message=msg)
            if x.get("unschedulable") != msg:
                x["unschedulable"] = msg
                self._scheduler_event(pod, "Warning", "FailedScheduling", msg)
            return
        name = fits[0]
        node = [n for n in self.sched_nodes if n["name"] == name][0]
        pod["spec"]["nodeName"] = name
        # the sandbox's address (the CNI's per-node range 10.244.<node>.0/24)
        index = self.sched_nodes.index(node) + 1
        ip = "10.244.%d.%d" % (index, 1 + len([p for p in self.pods.values() if p["spec"].get("nodeName") == name]))
        pod["status"].update(podIP=ip, podIPs=[{"ip": ip}], hostIP="192.0.2.%d" % index)
        self._set_cond(pod, "PodScheduled", "True")
        self._cond(pod, "PodScheduled").pop("message", None)
        self._set_cond(pod, "Ready", "False", "ContainersNotReady")
        x["scheduled"] = self.t
        pod["status"]["containerStatuses"] = [{"name": "engine", "ready": False, "started": False, "restartCount": 0,
                                               "state": {"waiting": {"reason": "ContainerCreating"}}}]
        self._scheduler_event(pod, "Normal", "Scheduled", "Successfully assigned %s/%s to %s"
                              % (self.ns, pod["metadata"]["name"], name))
        paths = [v["hostPath"]["path"] for v in pod["spec"].get("volumes") or [] if v.get("hostPath")]
        node["dirs"] = {p.rstrip("/") or "/" for p in paths if self.has_dir(name, p)}
        x["mount_errors"] = kube_scheduler.mount_errors(pod["spec"], node)

    def _kubelet(self, pod):
        if pod["metadata"].get("deletionTimestamp") is None and pod["spec"].get("nodeName") is None:
            self._schedule(pod)
            return
        errors = pod.get("x", {}).get("mount_errors")
        if errors and not pod["metadata"].get("deletionTimestamp"):
            for err in errors:
                self._event(pod, "Warning", "FailedMount", "MountVolume.SetUp failed for volume \"model\" : %s" % err)
            return
        super()._kubelet(pod)


# ---- the API server -------------------------------------------------------------------------------------------------

class KubeAPI:
    """``with KubeAPI(token, nodes, namespace) as api:`` an API server at ``api.url`` (127.0.0.1).

    nodes: kube_scheduler.node() dicts (name, labels, taints, allocatable); has_dir(node_name, path): whether a
    hostPath directory exists on that node (default: none does); engine: the kube_controllers.Engine of every
    model path (default: loads in 1 s).
    """

    def __init__(self, token, nodes, namespace, has_dir=None, engine=None):
        self.token = token
        self.namespace = namespace
        self.nodes = nodes
        self.requests = []
        self.store = {}  # (group, plural, namespace, name) -> object, for what no controller owns
        self._rv = 100
        self._lock = threading.RLock()
        self.cluster = _Controllers(namespace, nodes, has_dir or (lambda node, path: False),
                                    engine or kube_controllers.Engine(load_seconds=1), _timeline.iso(int(time.time())))
        self.server = None
        self.url = None

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def __enter__(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _do(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                code, doc, ctype = api.handle(self.command, self.path, dict(self.headers.items()), body,
                                              self.client_address[0])
                data = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do  # noqa: N815 (http.server's names)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # -- what the tests read ---------------------------------------------------------------------------------------------
    def writes(self):
        """The recorded requests that change (or would change, dryRun) something: every method but GET."""
        return [r for r in self.requests if r["method"] != "GET"]

    def pods(self):
        with self._lock:
            self._sync()
            return [p for p in self.cluster.objects() if p["kind"] == "Pod"]

    def objects(self):
        """Every object the API holds now (stored ones, the controllers' ones), with kind and apiVersion."""
        with self._lock:
            self._sync()
            return [self._with_status(copy.deepcopy(o)) for o in self.store.values()] + self.cluster.objects()

    # -- handling --------------------------------------------------------------------------------------------------------
    def handle(self, method, raw_path, headers, body, client):
        url = urlsplit(raw_path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        auth = headers.get("Authorization") or headers.get("authorization")
        record = dict(method=method, path=path, query=query, authorization=auth, client=client,
                      content_type=headers.get("Content-Type") or headers.get("content-type"),
                      dry_run=query.get("dryRun") == "All", status=None, time=time.time())
        with self._lock:
            self.requests.append(record)
            if path not in PUBLIC and auth != "Bearer %s" % self.token:
                answer = self._json(*_status(401, "Unauthorized", "Unauthorized"))
            else:
                self._sync()
                try:
                    answer = self._route(method, path, query, headers, body)
                except ValueError as e:
                    answer = self._json(*_status(400, "BadRequest", str(e)))
            record["status"] = answer[0]
            return answer

    @staticmethod
    def _json(code, doc):
        return code, doc, "application/json"

    def _route(self, method, path, query, headers, body):
        if path == "/version":
            return self._json(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"})
        if path in ("/healthz", "/livez", "/readyz"):
            return 200, "ok", "text/plain"
        if method == "GET" and path == "/api":
            return self._json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.split("//", 1)[1]}]})
        if method == "GET" and path == "/apis":
            return self._json(200, self._group_list())
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return self._json(*_status(404, "NotFound", "the server could not find the requested resource"))
        if not any(r[:2] == (group, version) for r in RESOURCES):
            return self._json(*_status(404, "NotFound", "the server could not find the requested resource"))
        if not rest:
            if method != "GET":
                return self._json(*_status(405, "MethodNotAllowed", "method not allowed"))
            return self._json(200, self._resource_list(group, version))
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        res = _resource(group, version, plural + ("/" + sub if sub else ""))
        if res is None or (namespace is not None and not res[4]):
            return self._json(*_status(404, "NotFound", "the server could not find the requested resource"))
        if query.get("watch") in ("1", "true"):
            return self._json(*_status(405, "MethodNotAllowed", "watch is not served by this stand-in"))
        if sub == "log":
            return self._log(namespace, name, query)
        if name is None:
            if method == "GET":
                return self._list(res, namespace, query)
            if method == "POST":
                return self._create(res, namespace, body, query)
            return self._json(*_status(405, "MethodNotAllowed", "method %s not allowed on a collection" % method))
        if method == "GET":
            obj = self._get(res, namespace, name)
            if obj is None:
                return self._not_found(res, name)
            return self._json(200, obj)
        if method in ("PATCH", "PUT"):
            return self._update(res, namespace, name, body, query, headers, method)
        if method == "DELETE":
            return self._delete(res, namespace, name, query)
        return self._json(*_status(405, "MethodNotAllowed", "method %s not allowed" % method))

    # -- discovery ----------------------------------------------------------------------------------------------------------
    @staticmethod
    def _group_list():
        groups = {}
        for group, version, _p, _k, _n, _v in RESOURCES:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": "%s/%s" % (g, v), "version": v} for v in vs],
             "preferredVersion": {"groupVersion": "%s/%s" % (g, vs[0]), "version": vs[0]}} for g, vs in groups.items()]}

    @staticmethod
    def _resource_list(group, version):
        out = []
        for g, v, plural, kind, namespaced, verbs in RESOURCES:
            if (g, v) == (group, version):
                out.append({"name": plural, "singularName": "" if "/" in plural else kind.lower(),
                            "namespaced": namespaced, "kind": kind, "verbs": list(verbs)})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": _group_version(group, version),
                "resources": out}

    # -- objects --------------------------------------------------------------------------------------------------------------
    def _next_rv(self):
        self._rv += 1
        return str(self._rv)

    def _sync(self):
        now = int(time.time())
        while self.cluster.t < now:
            self.cluster.advance(1)

    def _controlled(self, res):
        group, version, plural, kind = res[:4]
        items = []
        if (group, plural) == ("", "pods"):
            items = [o for o in self.cluster.objects() if o["kind"] == "Pod"]
        elif (group, plural) == ("", "events"):
            items = [o for o in self.cluster.objects() if o["kind"] == "Event"]
        elif (group, plural) == ("apps", "deployments"):
            items = [o for o in self.cluster.objects() if o["kind"] == "Deployment"]
        elif (group, plural) == ("apps", "replicasets"):
            items = [o for o in self.cluster.objects() if o["kind"] == "ReplicaSet"]
        for o in items:
            o.update(kind=kind, apiVersion=_group_version(group, version))
            o["metadata"].setdefault("resourceVersion", str(self._rv))
        return items

    def _all(self, res):
        group, version, plural, kind, _namespaced, _verbs = res
        if (group, plural) in CONTROLLED:
            return self._controlled(res)
        if (group, plural) == ("", "nodes"):
            return [self._node(n) for n in self.nodes]
        if (group, plural) == ("discovery.k8s.io", "endpointslices"):
            return self._endpointslices()
        if (group, plural) == ("", "namespaces"):
            names = sorted({self.namespace} | {k[2] for k in self.store if k[2]})
            return [{"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": n}, "status": {"phase": "Active"}}
                    for n in names]
        return [self._with_status(copy.deepcopy(o)) for k, o in self.store.items() if k[:2] == (group, plural)]

    def _node(self, n):
        return {"kind": "Node", "apiVersion": "v1",
                "metadata": {"name": n["name"], "labels": dict(n["labels"])},
                "spec": {"taints": [dict(t) for t in n["taints"]]} if n["taints"] else {},
                "status": {"allocatable": dict(n["allocatable"]), "capacity": dict(n["allocatable"]),
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}

    def _endpointslices(self):
        """One EndpointSlice per Service with a selector (kubernetes v1.33.0 pkg/controller/endpointslice,
        staging/src/k8s.io/endpointslice/utils.go ``podToEndpoint``: pods without an IP or finished are left out;
        ``serving`` = the pod is Ready, ``terminating`` = it has a deletionTimestamp, ``ready`` = serving and not
        terminating; the targetPort is resolved by the pod's container port name)."""
        pods = [p for p in self.cluster.objects() if p["kind"] == "Pod"]
        out = []
        for (group, plural, ns, name), svc in sorted(self.store.items()):
            selector = (svc.get("spec") or {}).get("selector") or {}
            if (group, plural) != ("", "services") or not selector:
                continue
            endpoints, ports = [], {}
            for pod in pods:
                labels = pod["metadata"].get("labels") or {}
                if pod["metadata"].get("namespace") != ns or any(labels.get(k) != v for k, v in selector.items()):
                    continue
                if not pod["status"].get("podIP") or pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                serving = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
                terminating = bool(pod["metadata"].get("deletionTimestamp"))
                endpoints.append({"addresses": [pod["status"]["podIP"]], "nodeName": pod["spec"].get("nodeName"),
                                  "conditions": {"ready": serving and not terminating, "serving": serving,
                                                 "terminating": terminating},
                                  "targetRef": {"kind": "Pod", "namespace": ns, "name": pod["metadata"]["name"],
                                                "uid": pod["metadata"]["uid"]}})
                for sp in svc["spec"].get("ports") or []:
                    target = sp.get("targetPort", sp.get("port"))
                    if isinstance(target, str):
                        target = next((cp["containerPort"] for c in pod["spec"]["containers"] for cp in c.get("ports") or []
                                       if cp.get("name") == target), None)
                    if target is not None:
                        ports[sp.get("name", "")] = {"name": sp.get("name", ""), "port": target,
                                                     "protocol": sp.get("protocol", "TCP")}
            out.append({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
                        "metadata": {"name": "%s-%s" % (name, kube_controllers.compute_hash({"svc": name})[:5]),
                                     "namespace": ns, "resourceVersion": str(self._rv),
                                     "labels": {"kubernetes.io/service-name": name,
                                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                        "endpoints": endpoints, "ports": list(ports.values())})
        return out

    def _get(self, res, namespace, name):
        for obj in self._all(res):
            meta = obj["metadata"]
            if meta.get("name") == name and (not res[4] or meta.get("namespace") == namespace):
                return obj
        return None

    def _not_found(self, res, name):
        return self._json(*_status(404, "NotFound", "%s \"%s\" not found" % (_qualified(res[0], res[2]), name),
                                   {"name": name, "group": res[0], "kind": res[2]}))

    def _list(self, res, namespace, query):
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"))
        items = []
        for obj in self._all(res):
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                continue
            if labels(obj["metadata"].get("labels")) and fields(obj):
                item = copy.deepcopy(obj)
                item.pop("kind", None)
                item.pop("apiVersion", None)
                items.append(item)
        return self._json(200, {"kind": res[3] + "List", "apiVersion": _group_version(res[0], res[1]),
                                "metadata": {"resourceVersion": str(self._rv)}, "items": items})

    def _check_body(self, res, namespace, obj, name=None):
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise ValueError("the body is not a %s object" % res[3])
        if obj.get("kind") not in (None, res[3]) or obj.get("apiVersion") not in (None, _group_version(res[0], res[1])):
            raise ValueError("the API version in the data (%s) does not match the expected API version (%s) or kind "
                             "%s is not %s" % (obj.get("apiVersion"), _group_version(res[0], res[1]), obj.get("kind"),
                                               res[3]))
        meta = obj["metadata"]
        if res[4] and meta.get("namespace") not in (None, namespace):
            raise ValueError("the namespace of the provided object does not match the namespace sent on the request")
        if not meta.get("name"):
            raise ValueError("name or generateName is required")
        if name is not None and meta["name"] != name:
            raise ValueError("the name of the object (%s) does not match the name on the URL (%s)" % (meta["name"], name))

    def _create(self, res, namespace, body, query):
        if "create" not in res[5]:
            return self._json(*_status(405, "MethodNotAllowed", "create is not allowed on %s" % res[2]))
        obj = json.loads(body or b"{}")
        self._check_body(res, namespace, obj)
        name = obj["metadata"]["name"]
        if self._get(res, namespace, name) is not None:
            return self._json(*_status(409, "AlreadyExists", "%s \"%s\" already exists" % (_qualified(res[0], res[2]), name),
                                       {"name": name, "group": res[0], "kind": res[2]}))
        obj = copy.deepcopy(obj)
        obj.update(kind=res[3], apiVersion=_group_version(res[0], res[1]))
        meta = obj["metadata"]
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=self._next_rv(), generation=1,
                    creationTimestamp=_timeline.iso(self.cluster.t))
        if query.get("dryRun") == "All":
            return self._json(201, obj)
        return self._json(201, self._store(res, namespace, obj, None))

    def _store(self, res, namespace, obj, old):
        if (res[0], res[2]) == ("apps", "deployments"):
            if namespace != self.namespace:
                raise ValueError("this stand-in runs Deployments in namespace %s only" % self.namespace)
            dep = self.cluster.apply(obj)
            for key in ("labels", "annotations"):
                dep["metadata"][key] = dict(obj["metadata"].get(key) or {})
            dep["metadata"].update(uid=obj["metadata"]["uid"] if old is None else dep["metadata"]["uid"],
                                   resourceVersion=obj["metadata"]["resourceVersion"])
            return self._get(res, namespace, obj["metadata"]["name"])
        if (res[0], res[2]) in CONTROLLED:
            raise ValueError("%s are written by the controllers here" % res[2])
        if old is not None and old.get("spec") != obj.get("spec"):
            obj["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        self.store[(res[0], res[2], namespace or "", obj["metadata"]["name"])] = obj
        return self._with_status(copy.deepcopy(obj))

    def _update(self, res, namespace, name, body, query, headers, method):
        if ("patch" if method == "PATCH" else "update") not in res[5]:
            return self._json(*_status(405, "MethodNotAllowed", "%s is not allowed on %s" % (method, res[2])))
        old = self._get(res, namespace, name)
        if old is None:
            return self._not_found(res, name)
        ctype = (headers.get("Content-Type") or headers.get("content-type") or "").split(";")[0].strip()
        doc = json.loads(body or b"{}")
        if method == "PUT":
            new = doc
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            new = merge_patch(old, doc)
        else:
            return self._json(*_status(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                       "accepted media types include: application/merge-patch+json, "
                                       "application/strategic-merge-patch+json (here)"))
        self._check_body(res, namespace, new, name)
        new = copy.deepcopy(new)
        new.update(kind=res[3], apiVersion=_group_version(res[0], res[1]))
        for key in ("uid", "creationTimestamp", "generation", "namespace"):
            if key in old["metadata"]:
                new["metadata"][key] = old["metadata"][key]
        new["metadata"]["resourceVersion"] = self._next_rv() if query.get("dryRun") != "All" else old["metadata"].get("resourceVersion")
        if query.get("dryRun") == "All":
            return self._json(200, new)
        return self._json(200, self._store(res, namespace, new, old))

    def _delete(self, res, namespace, name, query):
        if "delete" not in res[5]:
            return self._json(*_status(405, "MethodNotAllowed", "delete is not allowed on %s" % res[2]))
        key = (res[0], res[2], namespace or "", name)
        if (res[0], res[2]) == ("", "pods") and name in self.cluster.pods:
            if query.get("dryRun") != "All":
                pod = self.cluster.pods[name]
                pod["metadata"]["deletionTimestamp"] = _timeline.iso(self.cluster.t)
                pod["x-terminating-since"] = self.cluster.t
            return self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if key not in self.store:
            return self._not_found(res, name)
        if query.get("dryRun") != "All":
            del self.store[key]
        return self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {
            "name": name, "group": res[0], "kind": res[2]}})

    def _log(self, namespace, name, query):
        if name not in self.cluster.pods or namespace != self.namespace:
            return self._not_found(_resource("", "v1", "pods"), name)
        if query.get("previous") in ("1", "true"):
            return self._json(*_status(400, "BadRequest", "previous terminated container \"%s\" in pod \"%s\" not "
                                       "found" % (query.get("container", "engine"), name)))
        return 200, "", "text/plain"

    # -- HTTPRoute status (the gateway controller) ------------------------------------------------------------------------
    def _oracle_cluster(self):
        return aibrix_oracle.Cluster([o for o in self.store.values() if o["kind"] != "HTTPRoute"]
                                     + [o for o in self.store.values() if o["kind"] == "HTTPRoute"])

    def _with_status(self, obj):
        if obj.get("kind") != "HTTPRoute":
            return obj
        accepted, resolved = aibrix_oracle.route_conditions(self._oracle_cluster(), obj)
        gen = obj["metadata"].get("generation", 1)
        now = _timeline.iso(self.cluster.t)

        def cond(ctype, reason, good):
            return {"type": ctype, "status": "True" if reason == good else "False", "reason": reason,
                    "message": "", "observedGeneration": gen, "lastTransitionTime": now}

        parents = []
        for ref in obj["spec"].get("parentRefs") or []:
            parents.append({"parentRef": {"group": ref.get("group") or aibrix_oracle.GATEWAY_GROUP,
                                          "kind": ref.get("kind") or "Gateway",
                                          "namespace": ref.get("namespace") or obj["metadata"]["namespace"],
                                          "name": ref["name"]},
                            "controllerName": GATEWAY_CONTROLLER,
                            "conditions": [cond("Accepted", accepted, "Accepted"),
                                           cond("ResolvedRefs", resolved, "ResolvedRefs")]})
        obj["status"] = {"parents": parents}
        return obj

    # -- what the gateway sees ------------------------------------------------------------------------------------------------
    def gateway_objects(self):
        """The stored objects and the Ready, non-terminating pods (what the gateway's endpoints and pod cache hold)."""
        with self._lock:
            self._sync()
            pods = []
            for p in self.cluster.objects():
                if p["kind"] != "Pod" or p["metadata"].get("deletionTimestamp"):
                    continue
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])):
                    pods.append(p)
            return [copy.deepcopy(o) for o in self.store.values()] + pods


class Gateway:
    """``with Gateway(api, answer) as gw:`` the AIBrix v0.7.0 gateway in front of ``api`` at ``gw.url``, on
    ``host`` (default loopback): aibrix_oracle.gateway() over the API's objects and Ready pods; where the request
    reaches an engine, the engine answers ``answer``. Records (client address, method, path, route, status)."""

    def __init__(self, api, answer, host="127.0.0.1"):
        self.api, self.answer, self.host = api, answer, host
        self.seen = []
        self.server = None
        self.url = None

    def __enter__(self):
        gw = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _answer(self, method):
                body = {}
                if method == "POST":
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                answer = aibrix_oracle.gateway(gw.api.gateway_objects(), method, self.path, dict(self.headers.items()),
                                               model=body.get("model"))
                gw.seen.append((self.client_address[0], method, self.path.split("?")[0], answer.route, answer.status))
                if not answer.ok:
                    doc = {"error": {"message": answer.verdict.reason if answer.verdict else "", "code": answer.status}}
                elif answer.body is not None:
                    doc = answer.body
                elif self.path.startswith("/v1/chat/completions"):
                    doc = {"object": "chat.completion", "model": body.get("model"), "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": gw.answer}, "finish_reason": "stop"}]}
                else:
                    doc = {"object": "text_completion", "model": body.get("model"), "choices": [
                        {"index": 0, "text": gw.answer, "finish_reason": "stop"}]}
                data = json.dumps(doc).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._answer("GET")

            def do_POST(self):  # noqa: N802 (http.server's name)
                self._answer("POST")

        self.server = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self.url = "http://%s:%d" % (self.host, self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
