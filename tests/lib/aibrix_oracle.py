# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test oracle: what a cluster with AIBrix v0.7.0 does with a set of rendered objects.

Each rule is restated from the upstream source named beside it, without importing the collection's
renderers, so a renderer cannot pass by agreeing with itself. Nothing here runs a cluster: the objects are
"applied" in order to an in-memory store, AIBrix's route controller reacts to them as its informers would,
pods are expanded from their workloads' templates, and :func:`route` follows one request the way the
gateway plugin, Envoy (Gateway API) and the P/D front would, hop by hop.

Sources (vllm-project/aibrix at tag v0.7.0 unless named otherwise):

* ``pkg/controller/modelrouter/modelrouter_controller.go``: ``Add`` registers informers for Deployments,
  ModelAdapters, RayClusterFleets and (when the CRD exists) LeaderWorkerSets, not StormServices;
  ``createHTTPRoute`` reads ``model.aibrix.ai/name`` and ``model.aibrix.ai/port`` from the **object's own
  labels**, creates ``aibrix-system/<model>-router`` (parentRef Gateway ``aibrix-eg``, every ``modelPaths``
  prefix AND header ``model`` Exact, backendRef Service **named exactly the model** in the object's namespace,
  port from the label or 8000), ignores AlreadyExists, and calls ``createReferenceGrant`` (grant
  ``aibrix-system-reserved-referencegrant-in-<ns>`` for every Service) when the namespace differs;
  ``deleteHTTPRoute`` deletes ``<model>-router`` by name when such an object is deleted.
* ``pkg/plugins/gateway/gateway_req_body.go``: ``validateModelAvailability`` answers 400 "model %s does not
  exist" unless pods labelled with the model are known; the strategy comes from the ``routing-strategy``
  header, then the pod profile, then the gateway's env default (``deriveRoutingStrategyFromContext`` in
  ``util.go``); without one, ``validateHTTPRouteStatus`` (``gateway.go``) needs ``aibrix-system/<model>-router``
  with ``Accepted``/``Accepted`` and ``ResolvedRefs``/``ResolvedRefs`` or answers 503, and Envoy then follows
  the route; with one, the gateway picks a pod itself and sends the request to its IP and
  ``model.aibrix.ai/port`` (``utils.GetModelPortForPod``, 8000 when missing).
* ``pkg/plugins/gateway/configprofiles/configprofiles.go``: the ``model.aibrix.ai/config`` pod annotation,
  ``{"defaultProfile": ..., "profiles": {name: {"routingStrategy": ...}}}``, default profile ``default``.
* ``pkg/cache/informers.go``: the gateway's pod cache keeps pods with the model label, minus Ray workers.
* ``pkg/plugins/gateway/algorithms/pd_disaggregation.go``: the ``pd`` router groups pods by ``roleset-name``
  and ``role-name`` (``prefill``/``decode``), skips rolesets without both, uses only pods whose
  ``stormservice.orchestration.aibrix.ai/pod-group-index`` is missing or ``0``, and requires one
  ``model.aibrix.ai/engine`` across them; ``pd/engine/sglang.go`` sends ``bootstrap_host`` (the prefill pod
  IP) and ``bootstrap_port`` from the ``model.aibrix.ai/sglang-bootstrap-port`` pod annotation (8998 when
  missing); ``pd/engine/vllm.go`` and ``pd/prefill`` send vLLM ``kv_transfer_params``.
* ``pkg/controller/constants/stormservice.go``: StormService pods get ``role-name``, ``roleset-name`` and
  ``storm-service-name`` on top of the role template's labels.
* Gateway API v1.4.1 (``apis/v1/httproute_types.go`` BackendRef, ``apis/v1beta1/referencegrant_types.go``,
  ``apis/v1/shared_types.go`` reasons; the CRD text is vendored in tests/unit/fixtures/schemas): a backendRef
  defaults to group ``""``, kind ``Service`` and the route's namespace; another kind is ``InvalidKind``; a
  missing Service is ``BackendNotFound``; a reference into another namespace needs a ReferenceGrant *in that
  namespace* whose ``from`` names (group, HTTPRoute, the route's namespace) and whose ``to`` names (``""``,
  Service) with no name or the Service's name, else ``RefNotPermitted``; "When a HTTPBackendRef refers to a
  Service that has no ready endpoints, implementations SHOULD return a 503".
* The gateway's route table (:func:`gateway`), vllm-project/aibrix v0.7.0:
  ``config/gateway/gateway-plugin/gateway-plugin.yaml``: HTTPRoute ``reserved-router`` (deployed as
  ``aibrix-reserved-router``) sends :data:`RESERVED_ROUTER_PATHS` to the gateway plugin (EnvoyExtensionPolicy
  ``gateway-plugins-extension-policy``, ext_proc with the request body buffered, ``messageTimeout: 60s``);
  HTTPRoute ``reserved-router-metadata-endpoint`` sends :data:`METADATA_PATHS` to ``aibrix-metadata-service:8090``
  with ext_proc skipped; nothing else routes (no ``/health``: Envoy answers 404 to a path no route matches).
  ``config/gateway/gateway.yaml``: the EnvoyPatchPolicy ``epp`` inserts ``original_route`` as the first route
  of the listener's virtual host: prefix ``/`` with any ``routing-strategy`` header, to
  ``original_destination_cluster`` (ORIGINAL_DST on the ``target-pod`` request header), ``timeout: 120s``,
  ext_proc enabled; Helm ``dist/chart/values.yaml`` ``gateway.envoyPatchPolicy.route.timeout: 120s``,
  ``idleTimeout: 300s`` (``dist/chart/templates/gateway-instance/gateway.yaml``).
  ``pkg/plugins/gateway/gateway_req_headers.go``/``gateway_req_body.go``: the plugin reads the model from the
  body; without a strategy it checks ``<model>-router`` and sets the request header ``model`` (route cache
  cleared, so Envoy re-matches onto the per-model route and its ``timeouts.request`` applies); with one it sets
  ``routing-strategy`` and ``target-pod`` (IP:port), which lands on ``original_route``.
  ``pkg/plugins/gateway/gateway_rsp_headers.go``: every response the plugin processed gets ``x-went-into-req-headers:
  true`` and ``request-id``; ``routing-strategy``, ``target-pod`` (pod name) and ``target-pod-ip`` only when
  ``routerCtx.HasRouted()``; ``pd_disaggregation.go`` adds ``prefill-target-pod``/``prefill-target-pod-ip``.
  Gateway API v1.4.1 ``apis/v1/httproute_types.go`` (HTTPRouteRule, "Precedence"): among matching rules the
  longest path prefix wins, then the largest number of header matches, so a request that already carries
  ``model: <name>`` takes ``<model>-router`` directly and never reaches the plugin.
  ``python/aibrix/aibrix/metadata/api/v1/models.py``: ``/v1/models`` (and ``/v1/models/``) lists the
  ``model.aibrix.ai/name`` of Running pods, ``owned_by: aibrix``, no ``root``.
* The fronts: ``roles/pd_disagg/files/pd_proxy.py`` speaks vLLM NixlConnector ``kv_transfer_params`` only;
  SGLang's router (``sgl-model-gateway/bindings/python/src/sglang_router/router_args.py``,
  ``docs/advanced_features/sgl_model_gateway.md``): ``--prefill URL [BOOTSTRAP_PORT]``/``--decode URL``, or
  ``--service-discovery`` with ``--prefill-selector``/``--decode-selector`` (``key=value`` words),
  ``--service-discovery-port`` (default 80), ``--service-discovery-namespace`` and the bootstrap port read
  from the prefill pods' ``--bootstrap-port-annotation`` (default ``sglang.ai/bootstrap-port``); "RBAC must
  allow get, list, and watch on pods". SGLang's ``--disaggregation-bootstrap-port`` defaults to 8998.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

GATEWAY_NAMESPACE = "aibrix-system"
GATEWAY_NAME = "aibrix-eg"
GATEWAY_GROUP = "gateway.networking.k8s.io"
NAME = "model.aibrix.ai/name"
PORT = "model.aibrix.ai/port"
ENGINE = "model.aibrix.ai/engine"
CONFIG = "model.aibrix.ai/config"
SGLANG_BOOTSTRAP_ANNOTATION = "model.aibrix.ai/sglang-bootstrap-port"
DEFAULT_MODEL_PORT = 8000
DEFAULT_SGLANG_BOOTSTRAP_PORT = 8998
ROUTER_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"

# modelrouter_controller.go: the deployment/modelAdapter/fleet informers and watchedWorkloads.
WATCHED_KINDS = {("apps", "Deployment"), ("model.aibrix.ai", "ModelAdapter"),
                 ("orchestration.aibrix.ai", "RayClusterFleet"), ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")}
# modelrouter_controller.go modelPaths (v0.7.0).
MODEL_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings",
               "/v1/rerank", "/v1/classify", "/generate", "/generatevideo", "/v1/audio/transcriptions",
               "/v1/audio/translations")


def group_kind(obj):
    api = obj.get("apiVersion") or ""
    return (api.split("/", 1)[0] if "/" in api else ""), obj.get("kind")


def key(obj):
    meta = obj.get("metadata") or {}
    return group_kind(obj) + (meta.get("namespace") or "", meta.get("name"))


# --------------------------------------------------------------------------------------------- #
# AIBrix's route controller
# --------------------------------------------------------------------------------------------- #


def controller_objects(obj):
    """The HTTPRoute and ReferenceGrant ``createHTTPRoute`` makes for one workload (empty when it ignores it)."""
    if group_kind(obj) not in WATCHED_KINDS:
        return []
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    model = labels.get(NAME)
    if model is None:
        return []
    namespace = meta.get("namespace") or "default"
    try:
        port = int(labels.get(PORT, ""))
    except ValueError:
        port = DEFAULT_MODEL_PORT
    header = {"type": "Exact", "name": "model", "value": model}
    out = [{
        "apiVersion": GATEWAY_GROUP + "/v1", "kind": "HTTPRoute",
        "metadata": {"name": "%s-router" % model, "namespace": GATEWAY_NAMESPACE},
        "spec": {"parentRefs": [{"name": GATEWAY_NAME, "namespace": GATEWAY_NAMESPACE}],
                 "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": p}, "headers": [dict(header)]}
                                        for p in MODEL_PATHS],
                            "backendRefs": [{"name": model, "namespace": namespace, "port": port}],
                            "timeouts": {"request": "120s"}}]},
    }]
    if namespace != GATEWAY_NAMESPACE:
        out.append({
            "apiVersion": GATEWAY_GROUP + "/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "%s-reserved-referencegrant-in-%s" % (GATEWAY_NAMESPACE, namespace),
                         "namespace": namespace},
            "spec": {"from": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "namespace": GATEWAY_NAMESPACE}],
                     "to": [{"group": "", "kind": "Service"}]},
        })
    return out


class Cluster:
    """The objects applied in order, with AIBrix's route controller reacting to each watched workload."""

    def __init__(self, objects, extra=()):
        self.store = {}
        self.controller_made = []
        # Workloads whose deletion makes deleteHTTPRoute remove <model>-router, whoever created it.
        self.route_deleters = []
        for obj in list(extra) + list(objects):
            obj = copy.deepcopy(obj)
            obj.setdefault("metadata", {}).setdefault("namespace", "default")
            self.store[key(obj)] = obj
            for made in controller_objects(obj):
                if made["kind"] == "HTTPRoute":
                    self.route_deleters.append((obj["kind"], obj["metadata"]["name"], made["metadata"]["name"]))
                if key(made) not in self.store:  # Create; AlreadyExists is ignored
                    self.store[key(made)] = made
                    self.controller_made.append(made)
        self.pods = list(self._expand_pods())

    def get(self, group, kind, namespace, name):
        return self.store.get((group, kind, namespace, name))

    def all(self, group, kind, namespace=None):
        return [o for k, o in self.store.items() if k[:2] == (group, kind) and (namespace is None or k[2] == namespace)]

    def _expand_pods(self):
        for obj in list(self.store.values()):
            gk = group_kind(obj)
            ns = obj["metadata"]["namespace"]
            if gk == ("", "Pod"):
                yield Pod(ns, obj["metadata"]["name"], obj["metadata"].get("labels") or {},
                          obj["metadata"].get("annotations") or {}, obj.get("spec") or {}, obj)
            elif gk in (("apps", "Deployment"), ("apps", "StatefulSet")):
                t = obj["spec"]["template"]
                for i in range(obj["spec"].get("replicas", 1)):
                    yield Pod(ns, "%s-%d" % (obj["metadata"]["name"], i), (t.get("metadata") or {}).get("labels") or {},
                              (t.get("metadata") or {}).get("annotations") or {}, t["spec"], obj)
            elif gk == ("orchestration.aibrix.ai", "StormService"):
                name = obj["metadata"]["name"]
                for rs in range(obj["spec"].get("replicas", 1)):
                    roleset = "%s-roleset-%d" % (name, rs)
                    for role in obj["spec"]["template"]["spec"]["roles"]:
                        t = role["template"]
                        labels = dict((t.get("metadata") or {}).get("labels") or {})
                        labels.update({"role-name": role["name"], "roleset-name": roleset, "storm-service-name": name})
                        for i in range(role.get("replicas", 1)):
                            yield Pod(ns, "%s-%s-%d" % (roleset, role["name"], i), labels,
                                      (t.get("metadata") or {}).get("annotations") or {}, t["spec"], obj)


@dataclass
class Pod:
    namespace: str
    name: str
    labels: dict
    annotations: dict
    spec: dict
    owner: dict

    @property
    def container(self):
        return self.spec["containers"][0]

    @property
    def argv(self):
        c = self.container
        return list(c.get("command") or []) + list(c.get("args") or [])

    def container_ports(self):
        return {(p.get("name"), p["containerPort"]) for c in self.spec["containers"] for p in c.get("ports") or []}

    def has_port(self, port):
        return any(number == port for _name, number in self.container_ports())

    def named_port(self, port):
        if isinstance(port, int):
            return port if self.has_port(port) else None
        return next((number for name, number in self.container_ports() if name == port), None)


def flag(argv, name, default=None):
    """The value of ``--name v`` / ``--name=v`` in an argv (the last one wins, as argparse)."""
    value = default
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(name + "="):
            value = tok.split("=", 1)[1]
    return value


def words_after(argv, name):
    """Every group of words following ``name`` up to the next ``--`` option (argparse ``nargs='+'``, append)."""
    groups = []
    for i, tok in enumerate(argv):
        if tok == name:
            group = []
            for w in argv[i + 1:]:
                if w.startswith("--"):
                    break
                group.append(w)
            groups.append(group)
    return groups


# --------------------------------------------------------------------------------------------- #
# What a pod is
# --------------------------------------------------------------------------------------------- #


def engine_kind(pod):
    """``(engine, pd_role)``: engine ``vllm``/``sglang``/None; pd_role ``prefill``/``decode``/``kv_both``/None."""
    argv = pod.argv
    text = " ".join(argv)
    if "sglang.launch_server" in text:
        return "sglang", flag(argv, "--disaggregation-mode")
    if "vllm" in text and ("serve" in argv or "vllm.entrypoints.openai.api_server" in text):
        return "vllm", ("kv_both" if flag(argv, "--kv-transfer-config") else None)
    return None, None


def front_kind(pod):
    text = " ".join(pod.argv)
    if "pd_proxy.py" in text:
        return "pd_proxy"
    if "sglang_router.launch_router" in text and "--pd-disaggregation" in pod.argv:
        return "sglang_router"
    return None


@dataclass
class Verdict:
    """One request's fate: HTTP status, why, the hops it took and whether prefill and decode both served it."""
    status: int
    reason: str
    hops: list = field(default_factory=list)
    disaggregated: bool = False

    @property
    def ok(self):
        return self.status == 200

    def __str__(self):
        return "%d %s via %s%s" % (self.status, self.reason, " -> ".join(self.hops) or "-",
                                   " (P/D)" if self.disaggregated else "")


# --------------------------------------------------------------------------------------------- #
# Gateway API: route status and backend resolution
# --------------------------------------------------------------------------------------------- #


def grant_permits(cluster, route_ns, target_ns, service):
    for grant in cluster.all(GATEWAY_GROUP, "ReferenceGrant", target_ns):
        spec = grant.get("spec") or {}
        from_ok = any(f.get("group") == GATEWAY_GROUP and f.get("kind") == "HTTPRoute" and f.get("namespace") == route_ns
                      for f in spec.get("from") or [])
        to_ok = any((t.get("group") or "") == "" and t.get("kind") == "Service" and t.get("name") in (None, "", service)
                    for t in spec.get("to") or [])
        if from_ok and to_ok:
            return True
    return False


def route_conditions(cluster, route):
    """``(accepted_reason, resolved_reason)`` an implementation would write into the route's status."""
    ns = route["metadata"]["namespace"]
    accepted = "Accepted"
    for parent in route["spec"].get("parentRefs") or []:
        if (parent.get("group") or GATEWAY_GROUP, parent.get("kind") or "Gateway",
                parent.get("namespace") or ns, parent["name"]) != (GATEWAY_GROUP, "Gateway", GATEWAY_NAMESPACE, GATEWAY_NAME):
            accepted = "NoMatchingParent"
    resolved = "ResolvedRefs"
    for rule in route["spec"].get("rules") or []:
        for ref in rule.get("backendRefs") or []:
            if (ref.get("group") or "", ref.get("kind") or "Service") != ("", "Service"):
                return accepted, "InvalidKind"
            target_ns = ref.get("namespace") or ns
            if target_ns != ns and not grant_permits(cluster, ns, target_ns, ref["name"]):
                return accepted, "RefNotPermitted"
            if cluster.get("", "Service", target_ns, ref["name"]) is None:
                return accepted, "BackendNotFound"
    return accepted, resolved


def service_endpoints(cluster, namespace, name, port):
    """``[(pod, container_port)]`` behind ``Service namespace/name`` at service ``port`` (empty: no endpoints)."""
    svc = cluster.get("", "Service", namespace, name)
    if svc is None:
        return []
    sport = next((p for p in svc["spec"].get("ports") or [] if p["port"] == port), None)
    selector = svc["spec"].get("selector") or {}
    if sport is None or not selector:
        return []
    out = []
    for pod in cluster.pods:
        if pod.namespace == namespace and all(pod.labels.get(k) == v for k, v in selector.items()):
            target = pod.named_port(sport.get("targetPort", port))
            if target:
                out.append((pod, target))
    return out


def resolve_url(cluster, url, from_namespace):
    """``[(pod, port)]`` a ``http://<svc>[.<ns>[.svc[.cluster.local]]]:<port>`` URL reaches through cluster DNS."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    labels = host.split(".")
    namespace = labels[1] if len(labels) > 1 else from_namespace
    if len(labels) > 2 and labels[2] != "svc":
        return []
    return service_endpoints(cluster, namespace, labels[0], port)


# --------------------------------------------------------------------------------------------- #
# The request
# --------------------------------------------------------------------------------------------- #


def profile_strategy(pods):
    """configprofiles.ResolveProfile: the first pod with a parsable config; its default profile's strategy."""
    for pod in pods:
        raw = (pod.annotations.get(CONFIG) or "").strip()
        if not raw:
            continue
        try:
            cfg = json.loads(raw)
        except ValueError:
            continue
        profiles = cfg.get("profiles") or {}
        if not profiles:
            continue
        prof = profiles.get(cfg.get("defaultProfile") or "default")
        return (prof or {}).get("routingStrategy") or None
    return None


def route(objects, model, path="/v1/chat/completions", strategy=None, gateway_default=None, extra=()):
    """Follow one request for ``model`` on ``path`` through the gateway; ``extra``: objects already there."""
    cluster = objects if isinstance(objects, Cluster) else Cluster(objects, extra)
    labelled = [p for p in cluster.pods if p.labels.get(NAME) == model and p.labels.get("ray.io/node-type") != "worker"]
    if not labelled:
        return Verdict(400, "model %s does not exist (no pod carries %s=%s)" % (model, NAME, model))
    chosen = strategy or profile_strategy(labelled) or gateway_default
    if not chosen:
        return _via_route(cluster, model, path)
    if chosen == "pd":
        return _pd(cluster, labelled)
    # Any other strategy picks one labelled pod and sends the whole request to it.
    worst = None
    for pod in labelled:
        port = _model_port(pod)
        if not pod.has_port(port):
            return Verdict(503, "pod %s: %s=%d is not a container port" % (pod.name, PORT, port), [pod.name])
        v = serve(cluster, pod, port, ["%s/%s (%s)" % (pod.namespace, pod.name, chosen)])
        if worst is None or not v.ok or (worst.ok and not v.disaggregated):
            worst = v
    return worst


def _model_port(pod):
    try:
        return int(pod.labels.get(PORT, ""))
    except ValueError:
        return DEFAULT_MODEL_PORT


def _via_route(cluster, model, path):
    name = "%s-router" % model
    rt = cluster.get(GATEWAY_GROUP, "HTTPRoute", GATEWAY_NAMESPACE, name)
    if rt is None:
        return Verdict(503, "httproute %s/%s not found (no routing strategy, so the gateway needs it)"
                       % (GATEWAY_NAMESPACE, name))
    accepted, resolved = route_conditions(cluster, rt)
    if accepted != "Accepted":
        return Verdict(503, "httproute %s/%s, route is not accepted: %s" % (GATEWAY_NAMESPACE, name, accepted))
    if resolved != "ResolvedRefs":
        return Verdict(503, "httproute %s/%s, route's object references are not resolved: %s"
                       % (GATEWAY_NAMESPACE, name, resolved))
    hops = ["HTTPRoute %s/%s" % (GATEWAY_NAMESPACE, name)]
    for rule in rt["spec"]["rules"]:
        for m in rule.get("matches") or []:
            prefix = (m.get("path") or {}).get("value", "/")
            headers_ok = all(h.get("type", "Exact") == "Exact" and (h["name"] != "model" or h["value"] == model)
                             for h in m.get("headers") or [])
            if headers_ok and (path == prefix or path.startswith(prefix.rstrip("/") + "/")):
                for ref in rule.get("backendRefs") or []:
                    ns = ref.get("namespace") or GATEWAY_NAMESPACE
                    eps = service_endpoints(cluster, ns, ref["name"], ref.get("port"))
                    if not eps:
                        return Verdict(503, "Service %s/%s:%s has no endpoints" % (ns, ref["name"], ref.get("port")),
                                       hops + ["Service %s/%s" % (ns, ref["name"])])
                    return _all(cluster, eps, hops + ["Service %s/%s" % (ns, ref["name"])])
    return Verdict(404, "no rule of %s matches %s with header model=%s" % (name, path, model), hops)


def _all(cluster, endpoints, hops):
    """Every endpoint a load balancer may pick must serve; the weakest answer is the verdict."""
    worst = None
    for pod, port in endpoints:
        v = serve(cluster, pod, port, hops + ["%s/%s:%d" % (pod.namespace, pod.name, port)])
        if worst is None or not v.ok or (worst.ok and not v.disaggregated):
            worst = v
    return worst


def serve(cluster, pod, port, hops):
    """What ``pod`` does with a whole OpenAI request on ``port``."""
    front = front_kind(pod)
    if front == "pd_proxy":
        return _pd_proxy(cluster, pod, hops)
    if front == "sglang_router":
        return _sglang_router(cluster, pod, hops)
    engine, pd_role = engine_kind(pod)
    if engine is None:
        return Verdict(502, "%s is neither an engine nor a P/D front" % pod.name, hops)
    if engine == "sglang" and pd_role in ("prefill", "decode"):
        # A disaggregated SGLang engine needs bootstrap_host/port/room; without them a decode waits for a
        # prefill that never comes (AIBrix #2289) and a prefill finds no decode.
        return Verdict(504, "SGLang %s engine %s reached without bootstrap_host/port/room" % (pd_role, pod.name), hops)
    return Verdict(200, "served by %s engine %s alone" % (engine, pod.name), hops)


def _engines(cluster, endpoints, want_engine, want_role, what, hops):
    if not endpoints:
        return Verdict(503, "%s: no endpoints" % what, hops)
    for pod, _port in endpoints:
        engine, pd_role = engine_kind(pod)
        if engine != want_engine or (want_role and pd_role != want_role):
            return Verdict(502, "%s reaches %s (%s, %s), not a %s %s engine"
                           % (what, pod.name, engine, pd_role, want_engine, want_role or "kv_both"), hops)
    return None


def _configmap_mounted(cluster, pod):
    """The proxy script path must come from a mounted ConfigMap that exists and has that key."""
    script = next((t for t in pod.argv if t.endswith("pd_proxy.py")), "")
    for mount in pod.container.get("volumeMounts") or []:
        if script.startswith(mount["mountPath"].rstrip("/") + "/"):
            vol = next((v for v in pod.spec.get("volumes") or [] if v["name"] == mount["name"]), None)
            cm = vol and vol.get("configMap") and cluster.get("", "ConfigMap", pod.namespace, vol["configMap"]["name"])
            return bool(cm) and script.rsplit("/", 1)[1] in (cm.get("data") or {})
    return False


def _pd_proxy(cluster, pod, hops):
    argv = pod.argv
    if not _configmap_mounted(cluster, pod):
        return Verdict(502, "%s: the pd_proxy.py it runs is not in a mounted ConfigMap" % pod.name, hops)
    prefill = [e for url in [g[0] for g in words_after(argv, "--prefill")] for e in resolve_url(cluster, url, pod.namespace)]
    decode = [e for url in [g[0] for g in words_after(argv, "--decode")] for e in resolve_url(cluster, url, pod.namespace)]
    # pd_proxy.py sends kv_transfer_params (vLLM NixlConnector); SGLang engines need bootstrap fields instead.
    bad = (_engines(cluster, prefill, "vllm", "kv_both", "pd_proxy --prefill", hops)
           or _engines(cluster, decode, "vllm", "kv_both", "pd_proxy --decode", hops))
    if bad:
        return bad
    return Verdict(200, "pd_proxy: prefill on %s, decode on %s" % (prefill[0][0].name, decode[0][0].name),
                   hops + ["prefill %s" % prefill[0][0].name, "decode %s" % decode[0][0].name], disaggregated=True)


def _rbac_allows_pods(cluster, pod, namespace):
    """The pod's service account may get, list and watch pods in ``namespace`` (Role/ClusterRole bindings)."""
    sa = pod.spec.get("serviceAccountName") or "default"
    if sa != "default" and cluster.get("", "ServiceAccount", pod.namespace, sa) is None:
        return False
    rbac = "rbac.authorization.k8s.io"
    bindings = cluster.all(rbac, "RoleBinding", namespace) + cluster.all(rbac, "ClusterRoleBinding")
    for b in bindings:
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace", pod.namespace) == pod.namespace
                   for s in b.get("subjects") or []):
            continue
        ref = b["roleRef"]
        role = (cluster.get(rbac, ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])
                or cluster.get(rbac, ref["kind"], "default", ref["name"]))
        for rule in (role or {}).get("rules") or []:
            if "" in rule.get("apiGroups", []) and ({"pods", "*"} & set(rule.get("resources", []))) and \
                    ({"get", "list", "watch"} <= set(rule.get("verbs", [])) or "*" in rule.get("verbs", [])):
                return True
    return False


def _sglang_router(cluster, pod, hops):
    argv = pod.argv
    if "--service-discovery" in argv:
        namespace = flag(argv, "--service-discovery-namespace")
        port = int(flag(argv, "--service-discovery-port", "80"))
        if not _rbac_allows_pods(cluster, pod, namespace or pod.namespace):
            return Verdict(503, "%s: its service account may not get/list/watch pods, so it discovers no worker" % pod.name,
                           hops)
        annotation = flag(argv, "--bootstrap-port-annotation", ROUTER_BOOTSTRAP_ANNOTATION)
        found = {}
        for role in ("prefill", "decode"):
            selector = dict(w.split("=", 1) for g in words_after(argv, "--%s-selector" % role) for w in g)
            if not selector:
                return Verdict(503, "%s: no --%s-selector" % (pod.name, role), hops)
            pods = [q for q in cluster.pods if (namespace is None or q.namespace == namespace)
                    and all(q.labels.get(k) == v for k, v in selector.items())]
            found[role] = [(q, port) for q in pods if q.has_port(port)]
            bad = _engines(cluster, found[role], "sglang", role, "sglang_router --%s-selector" % role, hops)
            if bad:
                return bad
        for q, _port in found["prefill"]:
            engine_port = int(flag(q.argv, "--disaggregation-bootstrap-port", str(DEFAULT_SGLANG_BOOTSTRAP_PORT)))
            if q.annotations.get(annotation) != str(engine_port):
                return Verdict(504, "prefill %s: annotation %s=%r, but its bootstrap server listens on %d"
                               % (q.name, annotation, q.annotations.get(annotation), engine_port), hops)
    else:
        found = {}
        for role in ("prefill", "decode"):
            eps = [e for g in words_after(argv, "--" + role) for e in resolve_url(cluster, g[0], pod.namespace)]
            bad = _engines(cluster, eps, "sglang", role, "sglang_router --%s" % role, hops)
            if bad:
                return bad
            found[role] = eps
    return Verdict(200, "sglang_router: prefill on %s, decode on %s" % (found["prefill"][0][0].name, found["decode"][0][0].name),
                   hops + ["prefill %s" % found["prefill"][0][0].name, "decode %s" % found["decode"][0][0].name],
                   disaggregated=True)


def _rolesets(labelled):
    """``{roleset: (prefill pods, decode pods)}`` the ``pd`` router may pair: a prefill and a decode pod are paired
    only within one RoleSet (``filterPrefillDecodePods``: prefill and decode scores keyed by ``roleset-name``, a
    prefill's roleset looked up among the decode scores), among every labelled pod of the model it was given."""
    rolesets = {}
    for pod in labelled:
        if "roleset-name" not in pod.labels or "role-name" not in pod.labels:
            continue
        if pod.labels.get("stormservice.orchestration.aibrix.ai/pod-group-index", "0") != "0":
            continue
        rolesets.setdefault(pod.labels["roleset-name"], {}).setdefault(pod.labels["role-name"], []).append(pod)
    return dict((name, (rs["prefill"], rs["decode"])) for name, rs in sorted(rolesets.items())
                if rs.get("prefill") and rs.get("decode"))


def pd_candidates(objects, model):
    """``{roleset: {"prefill": [pod], "decode": [pod], "storm_service": name}}``: every pair the gateway's ``pd``
    router may send a request of ``model`` to (pods labelled ``model.aibrix.ai/name`` = ``model``, in any
    StormService: the router is given every pod of the model, ``readyPodList.All()``)."""
    cluster = objects if isinstance(objects, Cluster) else Cluster(objects)
    labelled = [p for p in cluster.pods if p.labels.get(NAME) == model and p.labels.get("ray.io/node-type") != "worker"]
    return dict((rs, {"prefill": [p.name for p in pre], "decode": [p.name for p in dec],
                      "storm_service": pre[0].labels.get("storm-service-name")})
                for rs, (pre, dec) in _rolesets(labelled).items())


def _pd(cluster, labelled):
    pairs = list(_rolesets(labelled).values())
    if not pairs:
        return Verdict(503, "pd: no roleset with both prefill and decode pods (labels roleset-name/role-name)")
    engines = {p.labels.get(ENGINE, "vllm") for p in labelled if "role-name" in p.labels}
    if len(engines) != 1:
        return Verdict(400, "pd: inconsistent %s labels %s" % (ENGINE, sorted(engines)))
    engine = engines.pop()
    for prefills, decodes in pairs:
        for pod in prefills + decodes:
            port = _model_port(pod)
            if not pod.has_port(port):
                return Verdict(503, "pod %s: %s=%d is not a container port" % (pod.name, PORT, port), [pod.name])
            kind, pd_role = engine_kind(pod)
            want = pod.labels["role-name"] if engine == "sglang" else "kv_both"
            if kind != engine or pd_role != want:
                return Verdict(502, "pd: %s is a %s %s engine, labelled %s %s" % (pod.name, kind, pd_role, engine,
                                                                                  pod.labels["role-name"]), [pod.name])
        if engine == "sglang":
            for pod in prefills:
                sent = int(pod.annotations.get(SGLANG_BOOTSTRAP_ANNOTATION, DEFAULT_SGLANG_BOOTSTRAP_PORT))
                listens = int(flag(pod.argv, "--disaggregation-bootstrap-port", str(DEFAULT_SGLANG_BOOTSTRAP_PORT)))
                if sent != listens:
                    return Verdict(504, "pd: gateway sends bootstrap_port %d to %s, whose bootstrap server listens on %d"
                                   % (sent, pod.name, listens), [pod.name])
    prefills, decodes = pairs[0]
    return Verdict(200, "pd: prefill %s, decode %s" % (prefills[0].name, decodes[0].name),
                   ["prefill %s" % prefills[0].name, "decode %s" % decodes[0].name], disaggregated=True)


def hazards(objects):
    """Things that break routing later: a labelled watched workload, whose deletion removes ``<model>-router``."""
    cluster = Cluster(objects)
    return ["%s %s: AIBrix's route controller creates/deletes %s for it" % d for d in cluster.route_deleters]


def models_listed(objects):
    """The ``/v1/models`` ids the metadata service returns: label values of (running) model pods, sorted."""
    return sorted({p.labels[NAME] for p in Cluster(objects).pods if NAME in p.labels
                   and p.labels.get("ray.io/node-type") != "worker"})


# --------------------------------------------------------------------------------------------- #
# The gateway's route table (AIBrix v0.7.0): what a client request meets, hop one
# --------------------------------------------------------------------------------------------- #

# config/gateway/gateway-plugin/gateway-plugin.yaml, HTTPRoute reserved-router (ext_proc: the gateway plugin).
RESERVED_ROUTER_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/v1/classify",
                         "/v1/images/generations", "/v1/video/generations")
# ... HTTPRoute reserved-router-metadata-endpoint (to aibrix-metadata-service:8090, ext_proc skipped).
METADATA_PATHS = ("/v1/models", "/v1/files", "/v1/batches")
# config/gateway/gateway.yaml EnvoyPatchPolicy epp, route original_route: timeout 120s (Helm
# dist/chart/values.yaml gateway.envoyPatchPolicy.route.timeout: 120s).
ORIGINAL_ROUTE = "original_route"
ORIGINAL_ROUTE_TIMEOUT_S = 120
# pkg/plugins/gateway/types.go and gateway_rsp_headers.go.
PLUGIN_HEADERS = ("x-went-into-req-headers", "request-id")
ROUTED_HEADERS = ("routing-strategy", "target-pod", "target-pod-ip")
# pkg/plugins/gateway/algorithms/pd_disaggregation.go (HeaderPrefillTargetPod / HeaderPrefillTargetPodIP).
PD_HEADERS = ("prefill-target-pod", "prefill-target-pod-ip")


def response_headers(strategy, target_pod=None, target_ip=None, port=DEFAULT_MODEL_PORT, request_id="req-1"):
    """The response headers the gateway plugin sets on a request it processed (``gateway_rsp_headers.go``
    ``HandleResponseHeaders``): ``x-went-into-req-headers: true`` and ``request-id`` always; ``routing-strategy``,
    ``target-pod`` (the pod's name) and ``target-pod-ip`` only when a strategy picked a pod
    (``routerCtx.HasRouted()``), the last being ``RoutingContext.TargetAddress()`` = ``<podIP>:<port>``
    (``pkg/types/router_context.go``)."""
    out = {"x-went-into-req-headers": "true", "request-id": request_id}
    if strategy and target_pod:
        out.update({"routing-strategy": strategy, "target-pod": target_pod,
                    "target-pod-ip": "%s:%d" % (target_ip, port)})
    return out


@dataclass
class GatewayAnswer:
    """What the client sees: ``status``, response ``headers`` AIBrix adds, the Envoy ``route`` that carried the
    request, its ``timeout_s`` (0 = none), the ``verdict`` behind it and, for ``/v1/models``, the JSON ``body``."""
    status: int
    route: str
    headers: dict = field(default_factory=dict)
    timeout_s: float = 0
    verdict: object = None
    body: object = None

    @property
    def ok(self):
        return self.status == 200


def _duration_s(text):
    """Seconds of an Envoy/Gateway API duration such as ``120s``, ``2m``, ``1h30m``, ``0s``."""
    total, num = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    text = str(text).strip()
    i = 0
    while i < len(text):
        c = text[i]
        if c.isdigit() or c == ".":
            num += c
        elif text[i:i + 2] == "ms":
            total += float(num) / 1000
            num = ""
            i += 1
        else:
            total += float(num) * units[c]
            num = ""
        i += 1
    return total


def original_route_timeout(cluster):
    """``original_route``'s timeout in seconds from the EnvoyPatchPolicy objects in the cluster (Envoy's route
    ``timeout``: 0 disables it), else the v0.7.0 install's 120 s."""
    for epp in cluster.all("gateway.envoyproxy.io", "EnvoyPatchPolicy"):
        for patch in (epp.get("spec") or {}).get("jsonPatches") or []:
            value = (patch.get("operation") or {}).get("value") or {}
            if isinstance(value, dict) and value.get("name") == ORIGINAL_ROUTE:
                return _duration_s((value.get("route") or {}).get("timeout", "15s"))  # Envoy's default is 15 s
    return ORIGINAL_ROUTE_TIMEOUT_S


def _prefix_matches(prefix, path):
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _table(cluster, path, headers):
    """Matching HTTPRoute rules, best first by Gateway API precedence (longest prefix, then most headers)."""
    found = []
    for prefix in RESERVED_ROUTER_PATHS:
        if _prefix_matches(prefix, path):
            found.append((len(prefix), 0, "reserved-router", None))
    for prefix in METADATA_PATHS:
        if _prefix_matches(prefix, path):
            found.append((len(prefix), 0, "reserved-router-metadata-endpoint", None))
    for rt in cluster.all(GATEWAY_GROUP, "HTTPRoute", GATEWAY_NAMESPACE):
        for rule in rt["spec"].get("rules") or []:
            for m in rule.get("matches") or []:
                prefix = (m.get("path") or {}).get("value", "/")
                hdrs = m.get("headers") or []
                if _prefix_matches(prefix, path) and all(headers.get(h["name"].lower()) == h["value"] for h in hdrs):
                    found.append((len(prefix), len(hdrs), rt["metadata"]["name"], rt))
    return sorted(found, key=lambda f: (-f[0], -f[1]))


def _per_model(cluster, rt, model, path, extra_headers):
    """Envoy follows ``<model>-router``: its backend, with the route's own request timeout."""
    name = rt["metadata"]["name"]
    timeout = _duration_s(((rt["spec"]["rules"][0].get("timeouts") or {}).get("request")) or "0s")
    accepted, resolved = route_conditions(cluster, rt)
    if accepted != "Accepted" or resolved != "ResolvedRefs":
        # Gateway API: a rule whose backendRefs are all invalid answers 500.
        return GatewayAnswer(500, name, dict(extra_headers), timeout, Verdict(500, "%s/%s" % (accepted, resolved)))
    v = _via_route(cluster, model, path)
    return GatewayAnswer(v.status, name, dict(extra_headers) if v.ok else {}, timeout, v)


def gateway(objects, method, path, headers=None, model=None, gateway_default=None, extra=()):
    """One request through AIBrix v0.7.0's gateway: ``headers`` as the client sends them, ``model`` the body's.

    Returns a :class:`GatewayAnswer`. ``gateway_default`` is the plugins Deployment's ``ROUTING_ALGORITHM``.
    """
    cluster = objects if isinstance(objects, Cluster) else Cluster(objects, extra)
    headers = dict((str(k).lower(), str(v)) for k, v in (headers or {}).items())
    path = path.split("?", 1)[0]
    if "routing-strategy" in headers:
        # original_route is routes/0: any path with the header. The plugin only acts on the paths it parses a
        # model from; without target-pod the ORIGINAL_DST cluster has no host (503, "no healthy upstream").
        if method != "POST" or not any(_prefix_matches(p, path) for p in RESERVED_ROUTER_PATHS + MODEL_PATHS):
            return GatewayAnswer(503, ORIGINAL_ROUTE, {}, original_route_timeout(cluster),
                                 Verdict(503, "original_route without target-pod"))
        return _plugin(cluster, path, headers, model, gateway_default, ORIGINAL_ROUTE)
    table = _table(cluster, path, headers)
    if not table:
        return GatewayAnswer(404, "", {}, 0, Verdict(404, "no route matches %s %s" % (method, path)))
    dummy, dummy2, name, rt = table[0]
    if name == "reserved-router-metadata-endpoint":
        if path.rstrip("/") != "/v1/models" or method != "GET":
            return GatewayAnswer(404, name, {}, 0, Verdict(404, "metadata service: %s %s" % (method, path)))
        body = {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "aibrix"}
                                           for m in models_listed(list(cluster.store.values()))]}
        return GatewayAnswer(200, name, {}, 0, Verdict(200, "metadata service"), body)
    if rt is not None:  # the client's model header matched the per-model route: the plugin never sees it
        return _per_model(cluster, rt, headers.get("model"), path, {})
    return _plugin(cluster, path, headers, model, gateway_default, name)


def _plugin(cluster, path, headers, model, gateway_default, first_route):
    """The gateway plugin (ext_proc) on a request it parses: gateway_req_body.go, then the route it lands on."""
    plugin = response_headers(None)
    if not model:
        return GatewayAnswer(400, first_route, {"x-error-no-model-in-request": "true"}, 0,
                             Verdict(400, "no model in the request body"))
    labelled = [p for p in cluster.pods if p.labels.get(NAME) == model and p.labels.get("ray.io/node-type") != "worker"]
    if not labelled:
        return GatewayAnswer(400, first_route, {"x-error-no-model-backends": model}, 0,
                             Verdict(400, "model %s does not exist" % model))
    strategy = headers.get("routing-strategy") or profile_strategy(labelled) or gateway_default
    if not strategy:
        v = _via_route(cluster, model, path)
        if v.status == 503 and "httproute" in v.reason:
            return GatewayAnswer(503, first_route, {"x-error-routing": "true"}, 0, v)
        rt = cluster.get(GATEWAY_GROUP, "HTTPRoute", GATEWAY_NAMESPACE, "%s-router" % model)
        return _per_model(cluster, rt, model, path, plugin)
    v = route(cluster, model, path, strategy=strategy)
    if not v.ok:
        return GatewayAnswer(v.status, ORIGINAL_ROUTE, {"x-error-routing": "true"} if v.status == 503 else {},
                             original_route_timeout(cluster), v)
    if strategy == "pd":  # hops: prefill <pod>, decode <pod>; target-pod is the decode pod
        target, prefill = v.hops[-1].split()[-1], v.hops[0].split()[-1]
    else:  # hops[0]: <ns>/<pod> (<strategy>)
        target, prefill = v.hops[0].split()[0].split("/")[-1], None
    hdrs = dict(plugin, **response_headers(strategy, target, "10.0.0.1"))
    if prefill:
        hdrs.update({"prefill-target-pod": prefill, "prefill-target-pod-ip": "10.0.0.2"})
    return GatewayAnswer(200, ORIGINAL_ROUTE, hdrs, original_route_timeout(cluster), v)
