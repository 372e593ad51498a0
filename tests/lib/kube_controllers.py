# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test model: what the Deployment and ReplicaSet controllers and the kubelet do to an engine Deployment, step by
step, as API objects (plain dicts as ``kubectl get -o json`` shows them).

Each rule is restated from the upstream source named beside it (kubernetes/kubernetes, tag v1.33.0, unless named
otherwise), without importing the collection, so the collection's wait cannot pass by agreeing with itself:

* API server, ``pkg/registry/apps/deployment/strategy.go`` ``PrepareForUpdate``: ``metadata.generation`` goes up
  by one when the spec changes; the status is the controller's, written later.
* ``pkg/controller/deployment/sync.go`` ``getNewReplicaSet``: the new ReplicaSet is the one whose template equals
  the Deployment's ignoring ``pod-template-hash`` (``util/deployment_util.go`` ``FindNewReplicaSet``,
  ``EqualIgnoreHash``); else one is created, named ``<deployment>-<hash>``, its template and selector labelled
  ``pod-template-hash: <hash>`` (``pkg/controller/controller_utils.go`` ``ComputeHash``: FNV-32a of the template,
  written with ``rand.SafeEncodeString``; here the FNV input is the template's JSON, so the value differs from a
  real cluster's but is stable and changes with the template), revision = the highest old revision + 1
  (``util/deployment_util.go`` ``SetNewReplicaSetAnnotations``, ``deployment.kubernetes.io/revision``).
* ``pkg/controller/deployment/rolling.go`` ``rolloutRolling``: scale the new ReplicaSet up to
  ``util.NewRSNewReplicas`` (``maxTotalPods = replicas + maxSurge`` against the sum of every ReplicaSet's
  ``spec.replicas``), then ``reconcileOldReplicaSets``: ``minAvailable = replicas - maxUnavailable``; old
  ReplicaSets are scaled down by at most ``available - minAvailable`` pods, oldest first
  (``scaleDownOldReplicaSetsForRollingUpdate``; unhealthy old pods first, ``cleanupUnhealthyReplicas``).
  With ``maxSurge: 0, maxUnavailable: 1`` and one replica the old pod is deleted first and the new one created
  while it still terminates.
* ``pkg/controller/deployment/sync.go`` ``calculateStatus``: ``replicas``/``readyReplicas``/``availableReplicas``
  summed over every ReplicaSet's status, ``updatedReplicas`` = the new ReplicaSet's ``status.replicas``,
  ``observedGeneration`` = ``metadata.generation``; ``progress.go``: ``Progressing`` with reason
  ``ProgressDeadlineExceeded`` when no progress was made for ``progressDeadlineSeconds``.
* ``pkg/controller/replicaset/replica_set.go`` ``manageReplicas``: create the missing pods, delete the extra ones
  (``getPodsToDelete``: not-ready before ready); ``status.replicas`` counts active pods only
  (``controller.FilterActivePods``: no ``deletionTimestamp``, not Succeeded/Failed). A create the API server
  refuses is the Warning Event ``FailedCreate`` "Error creating: <error>" on the ReplicaSet
  (``pkg/controller/controller_utils.go`` ``RealPodControl.createPods``, ``FailedCreatePodReason``; repeats are one
  Event with a growing count), and ``replica_set_utils.go`` ``calculateStatus`` sets the ReplicaSet condition
  ``ReplicaFailure`` True, reason ``FailedCreate``, message the error, when it has none (its
  ``lastTransitionTime`` stays at the first failure), and removes it once creating succeeds;
  ``pkg/controller/deployment/progress.go`` ``syncRolloutStatus`` / ``getReplicaFailures`` copies it onto the
  Deployment (the new ReplicaSet's first, ``util.ReplicaSetToDeploymentCondition``) or removes it.
* Admission of a pod (``Cluster.pod_security``: the namespace's ``pod-security.kubernetes.io/enforce`` level;
  ``staging/src/k8s.io/pod-security-admission``): ``admission/admission.go`` refuses with
  ``pods "<name>" is forbidden: violates PodSecurity "baseline:latest": <reason> (<detail>), ...``; the baseline
  checks used here are ``policy/check_capabilities_baseline.go`` ("non-default capabilities": a capability beyond
  the default set added), ``check_hostNamespaces.go`` ("host namespaces", ``hostNetwork=true``) and
  ``check_hostPathVolumes.go`` ("hostPath volumes", ``volume "<name>"``).
* The kubelet (``pkg/kubelet/prober/worker.go``): liveness and readiness results are ignored until the startup
  probe succeeded (``started``); a probe fails after ``failureThreshold`` consecutive failures, one per
  ``periodSeconds``; ``pkg/kubelet/prober/prober.go`` records ``Unhealthy`` "<Probe> probe failed: ...";
  ``pkg/kubelet/kuberuntime/kuberuntime_manager.go`` ``computePodActions`` kills a container whose liveness or
  startup probe failed with the ``Killing`` Event "Container <name> failed <probe> probe, will be restarted"
  (SIGTERM: vLLM shuts down cleanly and exits 0, reason ``Completed``); the restart waits out the crash-loop
  back-off (``pkg/kubelet/kubelet.go``: 10 s doubling up to 300 s, ``CrashLoopBackOff`` meanwhile), and the
  ended run becomes ``lastState.terminated`` with ``restartCount`` + 1.
* A terminating pod holds its node (and its GPUs) until it has exited.
* The EndpointSlice controller (``pkg/controller/endpointslice/endpointslice_controller.go`` ``syncService`` and
  ``staging/src/k8s.io/endpointslice/reconciler.go``; the API in k8s.io/api ``discovery/v1/types.go``): one slice per
  Service labelled ``kubernetes.io/service-name: <service>`` (``discovery.LabelServiceName``), ``managed-by``
  ``endpointslice-controller.k8s.io``; its endpoints are the pods matching the Service's selector that are not
  terminal and have an IP (``staging/src/k8s.io/endpointslice/util/controller_utils.go`` ``ShouldPodBeInEndpoints``
  with terminating pods included), each from ``staging/src/k8s.io/endpointslice/utils.go`` ``podToEndpoint``:
  ``serving`` = the pod is Ready, ``terminating`` = it has a ``deletionTimestamp``, ``ready`` = serving and not
  terminating, ``targetRef`` the pod. The controller works from its queue (pod events enqueue the Service,
  ``--endpointslice-updates-batch-period`` delays them; its API writes are rate limited), so what a client reads
  trails the pods: ``Cluster.endpoints_delay`` seconds here.
* The kubelet's pod IP (``status.podIP``), set once the sandbox runs (``pkg/kubelet/kubelet_pods.go``
  ``generateAPIPodStatus``); a new pod gets a new IP.

With ``fleet`` (nodes of tests/lib/kube_scheduler.py) the scheduler places each pod by that model's filters
(nodeSelector, required node affinity, taints, extended resources, required anti-affinity), several pods a node when
they fit; a pod that fits nowhere stays Pending with ``PodScheduled`` False, reason ``Unschedulable`` and a
``FailedScheduling`` Event whose text is ``pkg/scheduler/framework/types.go`` ``FitError.Error()``: "0/N nodes are
available: <count> <reason>, ... preemption: 0/N nodes are available: N Preemption is not helpful for scheduling."
(``pkg/scheduler/framework/preemption/preemption.go``: every node UnschedulableAndUnresolvable for a node-affinity or
taint misfit; "No preemption victims found for incoming pod" for missing resources, no lower-priority pod here).
The kubelet's hostPath check fails the mount of a node that lacks the directory (``FailedMount`` Events,
``ContainerCreating``), and an image in ``Cluster.missing_images`` is not pulled (``pkg/kubelet/images/
image_manager.go``: ``ErrImagePull`` then ``ImagePullBackOff``, Events ``Failed`` "Failed to pull image ...: not
found" and ``BackOff``).

AIBrix v0.7.0's StormService and RoleSet controllers (``pkg/controller/stormservice/sync.go`` ``scaling``/
``updateStatus``, ``rolesetoperations.go`` ``renderRoleSet``/``updateRoleSet``, ``pkg/controller/roleset/utils.go``
``renderStormServicePod``, ``pkg/controller/constants/stormservice.go``): ``spec.replicas`` RoleSets named
``<storm>-roleset-<5>`` (GenerateName), carrying the template's labels plus ``storm-service-name`` and
``storm-service-revision`` (the revision they were rendered from) and the annotations
``stormservice.orchestration.aibrix.ai/role-revision.<role>`` (each role's ControllerRevision number). The
revision label is on the RoleSet only: a pod inherits ``storm-service-name`` and gets ``roleset-name``,
``role-name``, ``role-template-hash`` and ``stormservice.orchestration.aibrix.ai/role-revision`` (its RoleSet's
annotation for its role), and a stateful role's pod is named ``<roleset>-<role>-<templateHash>-<index>``. With the
``InPlaceUpdate`` strategy the collection renders, an update re-renders the existing RoleSets in place (same names,
new revision label and annotations); the pods of a changed role template are replaced (their name carries the
template hash). Status ``observedGeneration``, ``currentRevision``/``updateRevision``, ``replicas`` (RoleSets),
``updatedReplicas`` (RoleSets of the update revision), ``readyReplicas`` and ``updatedReadyReplicas`` (RoleSets
whose pods are all Ready).
Any other object is stored as applied; an HTTPRoute gets the status the gateway's controller writes, from
tests/lib/aibrix_oracle.py ``route_conditions`` (Gateway API v1.4.1 Accepted/ResolvedRefs reasons).

The LeaderWorkerSet controller (kubernetes-sigs/lws, ``pkg/controllers/leaderworkerset_controller.go`` and
``pod_controller.go``; ``api/leaderworkerset/v1/leaderworkerset_types.go``): the leader StatefulSet ``<lws>`` with
``spec.replicas`` leader pods ``<lws>-<i>``, and per leader a worker StatefulSet ``<lws>-<i>`` of ``size - 1`` pods
``<lws>-<i>-<j>``; every StatefulSet and pod labelled ``leaderworkerset.sigs.k8s.io/name``, the pods also
``group-index``, ``worker-index`` and ``template-revision-hash`` (the revision of the template they were made
from). An update with ``maxUnavailable: 1, maxSurge: 0`` recreates one group at a time, the highest index first, once
the others are Ready. ``updateConditions``: ``readyReplicas`` = groups whose leader and workers are Ready,
``updatedReplicas`` = groups of the current revision; ``UpdateInProgress`` (reason GroupsUpdating) and
``Progressing`` True while a group is not updated, ``Available`` (AllGroupsReady) once all are updated and Ready, else
``Progressing`` (GroupsProgressing); the others False. ``Cluster.lws_version``: from ``(0, 9)`` (kubernetes-sigs/lws
#807) ``status.observedGeneration`` and every condition's ``observedGeneration`` are the generation reconciled;
before, neither is written. The StatefulSet controller creates each missing pod
(``pkg/controller/statefulset/stateful_pod_control.go``); a refused create is the Warning Event ``FailedCreate``
"create Pod <pod> in StatefulSet <set> failed error: <error>" on the StatefulSet (``recordPodEvent``), no
condition; ``status.replicas`` counts the pods it has.

The engine's own behaviour per model path (``Cluster.engines``) says how long it loads, and whether it stops
answering some time after it served. ``Cluster.models()`` answers ``GET /v1/models`` through the Service: from one
Ready pod in turn, ``root`` = the model path that pod loaded (vLLM ``serving_models.py`` ModelCard ``root``).

``Cluster.gateway_completion()`` is one completion through AIBrix v0.7.0's gateway (vllm-project/aibrix v0.7.0):
without a routing strategy the plugin sends it on to the per-model route, Envoy to one ready endpoint of the Service
(the slices as the controller last wrote them), and the answer names no pod; with one, the routing algorithm picks
among the gateway's cached pods that carry the model label and are routable (``pkg/utils/pod.go``
``FilterReadyPod``: a pod IP, not terminating, Ready), and the answer carries ``target-pod`` / ``target-pod-ip``
(``pkg/plugins/gateway/gateway_rsp_headers.go``, tests/lib/aibrix_oracle.py ``response_headers``). The gateway's
cache is fed by informers (``pkg/cache/informers.go``) and trails the API: ``Cluster.gateway_delay`` seconds here.
"""
from __future__ import annotations

import copy
import email.utils
import json

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.tests.lib import aibrix_oracle
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery pkg/util/rand rand.go alphanums


def compute_hash(template, collision_count=0):
    """``controller.ComputeHash``: FNV-32a, then ``rand.SafeEncodeString`` of its decimal digits."""
    h = 0x811C9DC5
    for byte in (json.dumps(template, sort_keys=True) + (str(collision_count) if collision_count else "")).encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(h))


def _without_hash(template):
    t = copy.deepcopy(template)
    (t.setdefault("metadata", {}).setdefault("labels", {})).pop(HASH_LABEL, None)
    return t


def model_path(pod):
    """The model path of a pod's rendered engine command: ``--model``/``--model-path <path>`` or ``vllm serve
    <path>``; None without one."""
    c = pod["spec"]["containers"][0]
    argv = list(c.get("command") or []) + list(c.get("args") or [])
    path = None
    for flag in ("--model", "--model-path"):
        if flag in argv[:-1]:
            path = argv[argv.index(flag) + 1]
    if path is None and "serve" in argv[:-1] and not argv[argv.index("serve") + 1].startswith("-"):
        path = argv[argv.index("serve") + 1]  # vllm serve <model>
    return path


class Engine(object):
    """How the engine of one model path behaves: ``load_seconds`` to answer /health after the container starts;
    ``hang_after`` seconds after it first served it stops answering (None: never); ``sigterm_exit`` its status
    after the kubelet's SIGTERM."""

    def __init__(self, load_seconds=60, hang_after=None, sigterm_exit=0):
        self.load_seconds, self.hang_after, self.sigterm_exit = load_seconds, hang_after, sigterm_exit


class Cluster(object):
    """One namespace, a few single-pod GPU nodes, the controllers and the kubelet, advanced one second at a time."""

    def __init__(self, namespace="llm-lab", nodes=("gpu-node-01", "gpu-node-02", "gpu-node-03"),
                 start="2026-08-02T08:00:00Z", pull_seconds=5, terminate_seconds=5, fleet=None):
        self.ns, self.nodes = namespace, list(nodes)
        self.fleet = [dict(n, pods=[]) for n in fleet] if fleet is not None else None
        if self.fleet is not None:
            self.nodes = [n["name"] for n in self.fleet]
        self.storms, self.others, self.missing_images = {}, {}, set()
        self.rolesets, self.storm_role_revisions = {}, {}
        self.lwss, self.statefulsets, self.lws_version = {}, {}, (0, 9)
        self.t = _timeline.parse_time(start)
        self.pull_seconds, self.terminate_seconds = pull_seconds, terminate_seconds
        self.deployments, self.replicasets, self.pods, self.events = {}, {}, {}, []
        self.engines = {}
        self._uid = 0
        self._answers = 0
        self.services, self.endpointslices = {}, {}
        self.endpoints_delay, self.gateway_delay = 0, 0
        self.gateway_rng = None  # a random.Random: the gateway picks as AIBrix's random strategy (gateway_completion)
        self._history = []  # (t, pods as the API showed them), for the views that trail it
        self._ips = 0
        self.pod_security = None  # the namespace's enforced Pod Security level ("baseline"), None: privileged

    # ---- API server ------------------------------------------------------------------------------------------

    def _new_uid(self):
        self._uid += 1
        return "00000000-0000-4000-8000-%012d" % self._uid

    def _iso(self, t=None):
        return _timeline.iso(self.t if t is None else t)

    def apply(self, manifest):
        """``kubectl apply``: a Deployment or StormService (the spec is replaced; the generation goes up when it
        changed), a Service, or any other object (stored as applied)."""
        kind = manifest.get("kind", "Deployment")
        if kind == "Service":
            return self.apply_service(manifest)
        if kind == "StormService":
            return self._apply_storm(manifest)
        if kind == "LeaderWorkerSet":
            return self._apply_lws(manifest)
        if kind != "Deployment":
            obj = copy.deepcopy(manifest)
            obj["metadata"].setdefault("namespace", self.ns)
            obj["metadata"].update(uid=self._new_uid(), generation=1, creationTimestamp=self._iso())
            self.others[(kind, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
            return obj
        name = manifest["metadata"]["name"]
        old = self.deployments.get(name)
        if old is None:
            obj = copy.deepcopy(manifest)
            obj["metadata"].update(namespace=self.ns, uid=self._new_uid(), generation=1, creationTimestamp=self._iso())
            obj["metadata"].setdefault("annotations", {})
            obj["status"] = {}
            self.deployments[name] = obj
        elif old["spec"] != manifest["spec"]:
            old["spec"] = copy.deepcopy(manifest["spec"])
            old["metadata"]["generation"] += 1
        return self.deployments[name]

    # ---- the Deployment controller ---------------------------------------------------------------------------

    def _owned(self, dep):
        return sorted((rs for rs in self.replicasets.values()
                       if rs["metadata"]["ownerReferences"][0]["uid"] == dep["metadata"]["uid"]),
                      key=lambda rs: (rs["metadata"]["creationTimestamp"], rs["metadata"]["name"]))

    def _sync_deployment(self, dep):
        spec = dep["spec"]
        owned = self._owned(dep)
        want = _without_hash(spec["template"])
        new = next((rs for rs in owned if _without_hash(rs["spec"]["template"]) == want), None)
        if new is None:
            h = compute_hash(spec["template"])
            template = copy.deepcopy(spec["template"])
            template["metadata"].setdefault("labels", {})[HASH_LABEL] = h
            revision = 1 + max([int(rs["metadata"]["annotations"][REVISION]) for rs in owned] or [0])
            new = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "%s-%s" % (dep["metadata"]["name"], h), "namespace": self.ns,
                                "uid": self._new_uid(), "creationTimestamp": self._iso(),
                                "labels": dict(template["metadata"]["labels"]),
                                "annotations": {REVISION: str(revision)},
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "controller": True,
                                                     "name": dep["metadata"]["name"], "uid": dep["metadata"]["uid"]}]},
                   "spec": {"replicas": 0, "template": template,
                            "selector": {"matchLabels": dict(spec["selector"]["matchLabels"], **{HASH_LABEL: h})}},
                   "status": {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0}}
            self.replicasets[new["metadata"]["name"]] = new
            owned.append(new)
            dep["metadata"]["annotations"][REVISION] = str(revision)
            self._progress(dep, "NewReplicaSetCreated", "Created new replica set %s" % new["metadata"]["name"])
        old = [rs for rs in owned if rs is not new]
        replicas = spec.get("replicas", 1)
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        max_surge, max_unavailable = rolling.get("maxSurge", 0), rolling.get("maxUnavailable", 1)
        # reconcileNewReplicaSet / NewRSNewReplicas
        current = sum(rs["spec"]["replicas"] for rs in owned)
        if new["spec"]["replicas"] < replicas and current < replicas + max_surge:
            new["spec"]["replicas"] += min(replicas + max_surge - current, replicas - new["spec"]["replicas"])
            self._progress(dep, "ReplicaSetUpdated", "scaled up %s" % new["metadata"]["name"])
        # reconcileOldReplicaSets: cleanupUnhealthyReplicas, then scaleDownOldReplicaSetsForRollingUpdate
        min_available = replicas - max_unavailable
        for rs in old:
            unhealthy = rs["spec"]["replicas"] - rs["status"].get("availableReplicas", 0)
            if unhealthy > 0:
                rs["spec"]["replicas"] -= unhealthy
        available = sum(rs["status"].get("availableReplicas", 0) for rs in owned)
        budget = available - min_available
        for rs in old:
            if budget <= 0:
                break
            down = min(rs["spec"]["replicas"], budget)
            if down:
                rs["spec"]["replicas"] -= down
                budget -= down
                self._progress(dep, "ReplicaSetUpdated", "scaled down %s" % rs["metadata"]["name"])
        # syncRolloutStatus: the ReplicaFailure of the new ReplicaSet, else of any (getReplicaFailures)
        failures = [c for rs in [new] + old for c in rs["status"].get("conditions", []) if c["type"] == "ReplicaFailure"]
        dconds = [c for c in dep["status"].get("conditions", []) if c["type"] != "ReplicaFailure"]
        if failures:
            c = failures[0]
            dconds.append({"type": "ReplicaFailure", "status": c["status"], "reason": c["reason"],
                           "message": c["message"], "lastUpdateTime": c["lastTransitionTime"],
                           "lastTransitionTime": c["lastTransitionTime"]})
        dep["status"]["conditions"] = dconds
        # calculateStatus
        st = dep["status"]
        st.update(observedGeneration=dep["metadata"]["generation"],
                  replicas=sum(rs["status"]["replicas"] for rs in owned),
                  updatedReplicas=new["status"]["replicas"],
                  readyReplicas=sum(rs["status"]["readyReplicas"] for rs in owned),
                  availableReplicas=sum(rs["status"]["availableReplicas"] for rs in owned))
        st["unavailableReplicas"] = max(0, replicas - st["availableReplicas"])
        if st["updatedReplicas"] == replicas and st["availableReplicas"] >= replicas and st["replicas"] == replicas:
            self._progress(dep, "NewReplicaSetAvailable", "ReplicaSet %s has successfully progressed"
                           % new["metadata"]["name"])
        else:
            cond = next((c for c in st.get("conditions", []) if c["type"] == "Progressing"), None)
            deadline = spec.get("progressDeadlineSeconds", 600)
            if cond and cond["reason"] != "NewReplicaSetAvailable" and \
                    self.t - _timeline.parse_time(cond["lastUpdateTime"]) > deadline:
                cond.update(status="False", reason="ProgressDeadlineExceeded",
                            message="ReplicaSet %s has timed out progressing." % new["metadata"]["name"])

    def _progress(self, dep, reason, message):
        conds = dep["status"].setdefault("conditions", [])
        cond = next((c for c in conds if c["type"] == "Progressing"), None)
        if cond is None:
            cond = {"type": "Progressing"}
            conds.append(cond)
        if cond.get("reason") != reason or reason != "NewReplicaSetAvailable":
            cond.update(status="True", reason=reason, message=message, lastUpdateTime=self._iso(),
                        lastTransitionTime=cond.get("lastTransitionTime") or self._iso())

    # ---- the ReplicaSet controller ---------------------------------------------------------------------------

    def _active(self, rs):
        return [p for p in self.pods.values() if p["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"]
                and not p["metadata"].get("deletionTimestamp") and p["status"]["phase"] not in ("Succeeded", "Failed")]

    def _sync_replicaset(self, rs):
        active = self._active(rs)
        diff = len(active) - rs["spec"]["replicas"]
        error = None
        for _i in range(-diff):
            error = self._create_pod(rs)
            if error:
                break  # slowStartBatch stops at the first error
        conds = rs["status"].setdefault("conditions", [])
        failure = next((c for c in conds if c["type"] == "ReplicaFailure"), None)
        if error and failure is None:
            conds.append({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": error,
                          "lastTransitionTime": self._iso()})
        elif not error and failure is not None:
            conds.remove(failure)
        if diff > 0:
            ranked = sorted(active, key=lambda p: (self._ready(p), p["metadata"]["creationTimestamp"]))
            for pod in ranked[:diff]:
                pod["metadata"]["deletionTimestamp"] = self._iso()
                pod["x-terminating-since"] = self.t
                self._event(pod, "Normal", "Killing", "Stopping container engine")
        active = self._active(rs)
        rs["status"].update(replicas=len(active), readyReplicas=sum(1 for p in active if self._ready(p)),
                            availableReplicas=sum(1 for p in active if self._ready(p)))

    def _create_pod(self, rs):
        """Create one pod of ``rs``; the API server's refusal (the error text) when admission denies it."""
        self._uid += 1
        name = "%s-%s" % (rs["metadata"]["name"], compute_hash({"n": self._uid})[:5])
        spec = copy.deepcopy(rs["spec"]["template"]["spec"])
        refused = self.admit(name, spec)
        if refused:
            self._object_event(rs, "Warning", "FailedCreate", "Error creating: %s" % refused, "replicaset-controller")
            return refused
        self.pods[name] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns, "uid": self._new_uid(), "creationTimestamp": self._iso(),
                         "labels": dict(rs["spec"]["template"]["metadata"]["labels"]),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True,
                                              "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"]}]},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                           "reason": "Unschedulable", "lastTransitionTime": self._iso(),
                                                           "message": "0/%d nodes are available" % len(self.nodes)}]},
        }
        return None

    def admit(self, name, spec):
        """The API server's refusal of a pod ``name`` with ``spec`` (None: admitted): Pod Security at
        :attr:`pod_security` (see the module docstring)."""
        if self.pod_security != "baseline":
            return None
        found = []
        default_caps = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                        "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
        bad = [(c["name"], cap) for c in spec.get("containers") or []
               for cap in (((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
               if cap not in default_caps]
        if bad:
            found.append("non-default capabilities (%s %s must not include %s in securityContext.capabilities.add)" % (
                "container" if len({c for c, _x in bad}) == 1 else "containers",
                ", ".join('"%s"' % c for c in sorted({c for c, _x in bad})),
                ", ".join('"%s"' % x for x in sorted({x for _c, x in bad}))))
        if spec.get("hostNetwork"):
            found.append("host namespaces (hostNetwork=true)")
        paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
        if paths:
            found.append("hostPath volumes (%s %s)" % ("volume" if len(paths) == 1 else "volumes",
                                                       ", ".join('"%s"' % n for n in paths)))
        if not found:
            return None
        return 'pods "%s" is forbidden: violates PodSecurity "baseline:latest": %s' % (name, ", ".join(found))

    def _object_event(self, obj, etype, reason, message, component):
        """An Event on a controller-side object (a ReplicaSet, a StatefulSet), aggregated by reason and message as the
        event recorder does (client-go tools/record events_cache.go: count + 1, lastTimestamp now)."""
        meta = obj["metadata"]
        for ev in self.events:
            if ev["involvedObject"]["uid"] == meta["uid"] and ev["reason"] == reason and ev["message"] == message:
                ev.update(count=ev["count"] + 1, lastTimestamp=self._iso())
                return
        self.events.append({
            "apiVersion": "v1", "kind": "Event", "type": etype, "reason": reason, "message": message, "count": 1,
            "metadata": {"name": "%s.%x" % (meta["name"], len(self.events)), "namespace": self.ns},
            "involvedObject": {"kind": obj["kind"], "name": meta["name"], "namespace": self.ns, "uid": meta["uid"],
                               "apiVersion": obj["apiVersion"]},
            "firstTimestamp": self._iso(), "lastTimestamp": self._iso(), "source": {"component": component}})

    # ---- scheduler and kubelet -------------------------------------------------------------------------------

    @staticmethod
    def _cond(pod, ctype):
        return next((c for c in pod["status"].get("conditions", []) if c["type"] == ctype), None)

    def _ready(self, pod):
        c = self._cond(pod, "Ready")
        return bool(c and c["status"] == "True")

    def _set_cond(self, pod, ctype, status, reason=None):
        c = self._cond(pod, ctype)
        if c is None:
            c = {"type": ctype}
            pod["status"]["conditions"].append(c)
        if c.get("status") != status:
            c.update(status=status, lastTransitionTime=self._iso())
        if reason:
            c["reason"] = reason
        elif "reason" in c and status == "True":
            del c["reason"]

    def _event(self, pod, etype, reason, message, container=None, component="kubelet"):
        container = container or pod["spec"]["containers"][0]["name"]
        for ev in self.events:
            if ev["involvedObject"]["uid"] == pod["metadata"]["uid"] and ev["reason"] == reason and ev["message"] == message:
                ev.update(count=ev["count"] + 1, lastTimestamp=self._iso())
                return
        ref = {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": self.ns, "uid": pod["metadata"]["uid"]}
        if component == "kubelet":
            ref["fieldPath"] = "spec.containers{%s}" % container
        self.events.append({
            "apiVersion": "v1", "kind": "Event", "type": etype, "reason": reason, "message": message, "count": 1,
            "metadata": {"name": "%s.%x" % (pod["metadata"]["name"], len(self.events)), "namespace": self.ns},
            "involvedObject": ref, "firstTimestamp": self._iso(), "lastTimestamp": self._iso(),
            "source": {"component": component}})

    def _engine_of(self, pod):
        path = model_path(pod)
        return path, self.engines.get(path) or Engine()

    # ---- kube-scheduler over the fleet (tests/lib/kube_scheduler.py filters) -----------------------------------------

    def _place(self, pod):
        """The node kube-scheduler binds ``pod`` to, or None after recording why none fits."""
        if self.fleet is None:
            busy = {p["spec"].get("nodeName") for p in self.pods.values() if p is not pod}
            free = [n for n in self.nodes if n not in busy]
            return free[0] if free else None
        for n in self.fleet:
            n["pods"] = [((p["metadata"].get("labels") or {}), self.ns, p["spec"]) for p in self.pods.values()
                         if p is not pod and p["spec"].get("nodeName") == n["name"]
                         and p["status"].get("phase") not in ("Succeeded", "Failed")]
        want = ("pod", pod["metadata"].get("labels") or {}, self.ns, pod["spec"])
        why, preempt = {}, {}
        for n in sorted(self.fleet, key=lambda n: n["name"]):
            # the framework stops at a node's first failing filter, in the default profile's order
            # (pkg/scheduler/apis/config/v1/default_plugins.go: TaintToleration, NodeAffinity, NodeResourcesFit, ...)
            first = next((r for r in (ks.taint_toleration(n_spec(want), n), ks.node_affinity(n_spec(want), n),
                                      ks.resources_fit(n_spec(want), n),
                                      ks.pod_anti_affinity(want[1], want[2], want[3], n, self.fleet)) if r), None)
            if first is None:
                return n["name"]
            why[first] = why.get(first, 0) + 1
            # Insufficient resources is Unschedulable (a victim could free room), the others UnschedulableAndUnresolvable
            verdict = "No preemption victims found for incoming pod" if first.startswith("Insufficient") \
                else "Preemption is not helpful for scheduling"
            preempt[verdict] = preempt.get(verdict, 0) + 1
        total = len(self.fleet)
        text = "0/%d nodes are available: %s. preemption: 0/%d nodes are available: %s." % (
            total, ", ".join("%d %s" % (c, r) for r, c in sorted(why.items())), total,
            ", ".join("%d %s" % (c, r) for r, c in sorted(preempt.items())))
        cond = self._cond(pod, "PodScheduled")
        cond.update(status="False", reason="Unschedulable", message=text)
        self._event(pod, "Warning", "FailedScheduling", text, component="default-scheduler")
        return None

    def _probe(self, pod, kind):
        p = pod["spec"]["containers"][0].get(kind) or {}
        return p.get("periodSeconds", 10), p.get("failureThreshold", 3), p.get("initialDelaySeconds", 0)

    def _kubelet(self, pod):
        st, x = pod["status"], pod.setdefault("x", {})
        if pod["metadata"].get("deletionTimestamp"):
            self._set_cond(pod, "Ready", "False", "PodNotReady")  # endpoints drop a terminating pod at once
            if self.t - pod["x-terminating-since"] >= self.terminate_seconds:
                del self.pods[pod["metadata"]["name"]]
            return
        if pod["spec"].get("nodeName") is None:
            node = self._place(pod)
            if node is None:
                return
            pod["spec"]["nodeName"] = node
            self._set_cond(pod, "PodScheduled", "True")
            self._cond(pod, "PodScheduled").pop("message", None)
            self._cond(pod, "PodScheduled").pop("reason", None)
            self._set_cond(pod, "Ready", "False", "ContainersNotReady")
            x["scheduled"] = self.t
            st["containerStatuses"] = [{"name": pod["spec"]["containers"][0]["name"], "ready": False, "started": False,
                                        "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]
            return
        cs = st["containerStatuses"][0]
        path, engine = self._engine_of(pod)
        if "running" not in cs["state"]:
            node = next((n for n in self.fleet or [] if n["name"] == pod["spec"]["nodeName"]), None)
            failed = ks.mount_errors(pod["spec"], node) if node is not None else []
            if failed:
                if (self.t - x["scheduled"]) % 10 == 0:
                    vol = next(v["name"] for v in pod["spec"]["volumes"] if (v.get("hostPath") or {}).get("type") == "Directory")
                    self._event(pod, "Warning", "FailedMount", 'MountVolume.SetUp failed for volume "%s" : %s'
                                % (vol, failed[0]))
                return
            until = x.get("backoff_until", x["scheduled"] + self.pull_seconds)
            if self.t < until:
                return
            image = pod["spec"]["containers"][0].get("image")
            if image in self.missing_images:
                pulls = x.get("pulls", 0) + 1
                x.update(pulls=pulls, backoff_until=self.t + min(300, 10 * 2 ** (pulls - 1)))
                self._event(pod, "Warning", "Failed", 'Failed to pull image "%s": rpc error: code = NotFound desc = '
                            'failed to pull and unpack image "%s": failed to resolve reference "%s": %s: not found'
                            % (image, image, image, image))
                if pulls > 1:
                    self._event(pod, "Normal", "BackOff", 'Back-off pulling image "%s"' % image)
                cs["state"] = {"waiting": {"reason": "ImagePullBackOff" if pulls > 1 else "ErrImagePull",
                                           "message": 'Back-off pulling image "%s"' % image if pulls > 1 else
                                           "rpc error: code = NotFound desc = %s: not found" % image}}
                return
            cs["state"] = {"running": {"startedAt": self._iso()}}
            st["phase"] = "Running"
            if not st.get("podIP"):
                self._ips += 1
                st["podIP"] = "10.244.%d.%d" % (self.nodes.index(pod["spec"]["nodeName"]) if pod["spec"]["nodeName"]
                                                in self.nodes else 99, self._ips)
            x.update(started=self.t, served=None, live_fails=0)
            return
        up = self.t - x["started"]
        answering = up >= engine.load_seconds and not (
            engine.hang_after is not None and x["served"] is not None and self.t - x["served"] >= engine.hang_after)
        s_period, s_threshold, s_delay = self._probe(pod, "startupProbe")
        if not cs["started"]:
            if answering and up % s_period == 0:
                cs["started"] = True
                cs["ready"] = True
                x["served"] = self.t
                self._set_cond(pod, "Ready", "True")
            elif up > s_delay + s_threshold * s_period:
                self._kill(pod, cs, "startup", engine)
            return
        l_period, l_threshold, _d = self._probe(pod, "livenessProbe")
        if answering:
            x["live_fails"] = 0
            return
        cs["ready"] = False
        self._set_cond(pod, "Ready", "False", "ContainersNotReady")
        if up % l_period == 0:
            x["live_fails"] += 1
            self._event(pod, "Warning", "Unhealthy", "Liveness probe failed: Get \"http://%s:8000/health\": context "
                        "deadline exceeded (Client.Timeout exceeded while awaiting headers)" % pod["spec"]["nodeName"])
            if x["live_fails"] >= l_threshold:
                self._kill(pod, cs, "liveness", engine)

    def _kill(self, pod, cs, probe, engine):
        x = pod["x"]
        self._event(pod, "Normal", "Killing", "Container %s failed %s probe, will be restarted"
                    % (pod["spec"]["containers"][0]["name"], probe))
        code = engine.sigterm_exit
        cs["lastState"] = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                          "startedAt": self._iso(x["started"]), "finishedAt": self._iso()}}
        cs["restartCount"] += 1
        cs.update(ready=False, started=False)
        backoff = min(300, 10 * 2 ** (cs["restartCount"] - 1))
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off %ds restarting failed container="
                                   "engine pod=%s" % (backoff, pod["metadata"]["name"])}}
        x["backoff_until"] = self.t + backoff
        self._set_cond(pod, "Ready", "False", "ContainersNotReady")

    # ---- time --------------------------------------------------------------------------------------------------

    def advance(self, seconds):
        """Let ``seconds`` pass: every second the controllers sync and the kubelet acts on each pod."""
        for _s in range(int(seconds)):
            self.t += 1
            for dep in list(self.deployments.values()):
                self._sync_deployment(dep)
            for rs in list(self.replicasets.values()):
                self._sync_replicaset(rs)
            for ss in list(self.storms.values()):
                self._sync_storm(ss)
            for lws in list(self.lwss.values()):
                self._sync_lws(lws)
            for pod in list(self.pods.values()):
                self._kubelet(pod)
            if self.endpoints_delay or self.gateway_delay:
                self._history.append((self.t, self._api_pods()))
                del self._history[:-max(2, self.endpoints_delay + 2, self.gateway_delay + 2)]
            for svc in self.services.values():
                self._sync_endpointslice(svc)

    # ---- AIBrix's StormService controller ------------------------------------------------------------------------

    def _apply_storm(self, manifest):
        name = manifest["metadata"]["name"]
        old = self.storms.get(name)
        if old is None:
            obj = copy.deepcopy(manifest)
            obj["metadata"].update(namespace=self.ns, uid=self._new_uid(), generation=1, creationTimestamp=self._iso())
            obj["status"] = {}
            self.storms[name] = obj
        elif old["spec"] != manifest["spec"]:
            old["spec"] = copy.deepcopy(manifest["spec"])
            old["metadata"]["generation"] += 1
        return self.storms[name]

    def _sync_storm(self, ss):
        name, spec = ss["metadata"]["name"], ss["spec"]
        revision = "%s-%s" % (name, compute_hash(spec["template"])[:10])
        role_revs = self.storm_role_revisions.setdefault(name, {})
        for role in spec["template"]["spec"]["roles"]:  # a ControllerRevision per role template
            h = compute_hash(role["template"])
            seen = role_revs.setdefault(role["name"], [])
            if h not in seen:
                seen.append(h)
        prefix = "stormservice.orchestration.aibrix.ai/role-revision"
        rolesets = []
        for i in range(spec.get("replicas", 1)):
            rs_name = "%s-roleset-%s" % (name, compute_hash({"s": name, "i": i})[:5])
            rs = self.rolesets.get(rs_name)
            labels = dict((spec["template"].get("metadata") or {}).get("labels") or {})
            labels.update({"storm-service-name": name, "storm-service-revision": revision})
            annotations = {"stormservice.orchestration.aibrix.ai/revision": revision,
                           "stormservice.orchestration.aibrix.ai/roleset-index": str(i)}
            annotations.update(("%s.%s" % (prefix, r), str(len(v))) for r, v in role_revs.items())
            if rs is None:
                rs = {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "RoleSet",
                      "metadata": {"name": rs_name, "namespace": self.ns, "uid": self._new_uid(),
                                   "creationTimestamp": self._iso(),
                                   "ownerReferences": [{"apiVersion": "orchestration.aibrix.ai/v1alpha1",
                                                        "kind": "StormService", "name": name, "controller": True,
                                                        "uid": ss["metadata"]["uid"]}]},
                      "status": {}}
                self.rolesets[rs_name] = rs
            rs["metadata"].update(labels=labels, annotations=annotations)  # InPlaceUpdate: the same RoleSet
            rolesets.append(rs)
        ready = 0
        for rs in rolesets:
            rs_name, pods = rs["metadata"]["name"], []
            for role in spec["template"]["spec"]["roles"]:
                t, h = role["template"], compute_hash(role["template"])[:10]
                for pod in list(self.pods.values()):  # pods of an older template of this role are replaced
                    pl = pod["metadata"].get("labels") or {}
                    if pl.get("roleset-name") == rs_name and pl.get("role-name") == role["name"] \
                            and pl.get("role-template-hash") != h and not pod["metadata"].get("deletionTimestamp"):
                        pod["metadata"]["deletionTimestamp"] = self._iso()
                        pod["x-terminating-since"] = self.t
                for j in range(role.get("replicas", 1)):
                    pod_name = "%s-%s-%s-%d" % (rs_name, role["name"], h, j)
                    if pod_name not in self.pods:
                        labels = dict((t.get("metadata") or {}).get("labels") or {})
                        labels.update({"storm-service-name": name, "roleset-name": rs_name, "role-name": role["name"],
                                       "role-template-hash": h,
                                       prefix: rs["metadata"]["annotations"].get("%s.%s" % (prefix, role["name"]), "")})
                        self.pods[pod_name] = {
                            "apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": pod_name, "namespace": self.ns, "uid": self._new_uid(),
                                         "creationTimestamp": self._iso(), "labels": labels,
                                         "annotations": dict((t.get("metadata") or {}).get("annotations") or {}),
                                         "ownerReferences": [{"apiVersion": "orchestration.aibrix.ai/v1alpha1",
                                                              "kind": "RoleSet", "name": rs_name, "controller": True,
                                                              "uid": rs["metadata"]["uid"]}]},
                            "spec": dict(copy.deepcopy(t["spec"]), hostname=pod_name, subdomain=name),
                            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                                           "lastTransitionTime": self._iso()}]}}
                    pods.append(self.pods[pod_name])
            if all(self._ready(p) for p in pods):
                ready += 1
        ss["status"] = {"observedGeneration": ss["metadata"]["generation"], "replicas": len(rolesets),
                        "currentRevision": revision, "updateRevision": revision, "currentReplicas": len(rolesets),
                        "updatedReplicas": len(rolesets), "readyReplicas": ready, "updatedReadyReplicas": ready,
                        "notReadyReplicas": len(rolesets) - ready,
                        "conditions": [{"type": "Ready" if ready >= spec.get("replicas", 1) else "Progressing",
                                        "status": "True", "reason": "Ready" if ready >= spec.get("replicas", 1)
                                        else "Processing"}]}

    # ---- the LeaderWorkerSet controller -------------------------------------------------------------------------

    LWS = "leaderworkerset.sigs.k8s.io/"

    def _apply_lws(self, manifest):
        name = manifest["metadata"]["name"]
        old = self.lwss.get(name)
        if old is None:
            obj = copy.deepcopy(manifest)
            obj["metadata"].update(namespace=self.ns, uid=self._new_uid(), generation=1, creationTimestamp=self._iso())
            obj["status"] = {}
            self.lwss[name] = obj
        elif old["spec"] != manifest["spec"]:
            old["spec"] = copy.deepcopy(manifest["spec"])
            old["metadata"]["generation"] += 1
        return self.lwss[name]

    def _sts(self, name, lws, replicas, owner):
        sts = self.statefulsets.get(name)
        if sts is None:
            sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                   "metadata": {"name": name, "namespace": self.ns, "uid": self._new_uid(),
                                "creationTimestamp": self._iso(), "labels": {self.LWS + "name": lws},
                                "ownerReferences": [owner]},
                   "spec": {"replicas": replicas}, "status": {"replicas": 0, "readyReplicas": 0}}
            self.statefulsets[name] = sts
        sts["spec"]["replicas"] = replicas
        return sts

    def _sts_pod(self, sts, pod_name, template, labels):
        """The StatefulSet controller creates ``pod_name`` (None when admission refuses it: the Event is recorded)."""
        if pod_name in self.pods:
            return self.pods[pod_name]
        spec = copy.deepcopy(template.get("spec") or {})
        refused = self.admit(pod_name, spec)
        if refused:
            self._object_event(sts, "Warning", "FailedCreate", "create Pod %s in StatefulSet %s failed error: %s"
                               % (pod_name, sts["metadata"]["name"], refused), "statefulset-controller")
            return None
        self.pods[pod_name] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": self.ns, "uid": self._new_uid(), "creationTimestamp": self._iso(),
                         "labels": dict(((template.get("metadata") or {}).get("labels") or {}), **labels),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "controller": True,
                                              "name": sts["metadata"]["name"], "uid": sts["metadata"]["uid"]}]},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                           "reason": "Unschedulable", "lastTransitionTime": self._iso()}]}}
        return self.pods[pod_name]

    def _sync_lws(self, lws):
        name, spec, gen = lws["metadata"]["name"], lws["spec"], lws["metadata"]["generation"]
        lwt = spec["leaderWorkerTemplate"]
        size, replicas = lwt.get("size", 1), spec.get("replicas", 1)
        rev = compute_hash(lwt)[:10]
        owner = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "controller": True,
                 "name": name, "uid": lws["metadata"]["uid"]}
        leader_sts = self._sts(name, name, replicas, owner)

        def group_pods(i):
            return [p for n, p in self.pods.items() if n == "%s-%d" % (name, i) or n.startswith("%s-%d-" % (name, i))]

        def group_ready(i):
            pods = [p for p in group_pods(i) if not p["metadata"].get("deletionTimestamp")]
            return len(pods) == size and all(self._ready(p) for p in pods)

        def group_rev(i):
            leader = self.pods.get("%s-%d" % (name, i))
            return (leader["metadata"]["labels"].get(self.LWS + "template-revision-hash") if leader else None)

        # rolling update, maxUnavailable 1 / maxSurge 0: one old group at a time, the highest index first
        old = [i for i in range(replicas) if group_rev(i) not in (None, rev)]
        busy = any(p["metadata"].get("deletionTimestamp") for i in range(replicas) for p in group_pods(i))
        if old and not busy and all(group_ready(i) for i in range(replicas) if i not in old[-1:]):
            for pod in group_pods(old[-1]):
                pod["metadata"]["deletionTimestamp"] = self._iso()
                pod["x-terminating-since"] = self.t
        for i in range(replicas):
            leader_name = "%s-%d" % (name, i)
            if leader_name in self.pods and self.pods[leader_name]["metadata"].get("deletionTimestamp"):
                continue
            labels = {self.LWS + "name": name, self.LWS + "group-index": str(i), self.LWS + "worker-index": "0",
                      self.LWS + "template-revision-hash": group_rev(i) or rev}
            leader = self._sts_pod(leader_sts, leader_name, lwt.get("leaderTemplate") or lwt["workerTemplate"], labels)
            if leader is None or size < 2:
                continue
            by_leader = {"apiVersion": "v1", "kind": "Pod", "controller": True, "name": leader_name,
                         "uid": leader["metadata"]["uid"]}
            worker_sts = self._sts(leader_name, name, size - 1, by_leader)
            for j in range(1, size):
                self._sts_pod(worker_sts, "%s-%d" % (leader_name, j), lwt["workerTemplate"],
                              dict(labels, **{self.LWS + "worker-index": str(j)}))
        for sts in self.statefulsets.values():
            mine = [p for p in self.pods.values() if p["metadata"]["ownerReferences"][0].get("uid") == sts["metadata"]["uid"]
                    and not p["metadata"].get("deletionTimestamp")]
            sts["status"].update(replicas=len(mine), readyReplicas=sum(1 for p in mine if self._ready(p)))
        ready = sum(1 for i in range(replicas) if group_ready(i))
        updated = sum(1 for i in range(replicas) if group_rev(i) == rev and len(group_pods(i)) == size)
        if updated < replicas:
            chosen = {"UpdateInProgress": "GroupsUpdating", "Progressing": "GroupsProgressing"}
        elif ready == replicas:
            chosen = {"Available": "AllGroupsReady"}
        else:
            chosen = {"Progressing": "GroupsProgressing"}
        conds = []
        for ctype, reason in (("Available", "AllGroupsReady"), ("Progressing", "GroupsProgressing"),
                              ("UpdateInProgress", "GroupsUpdating")):
            cond = {"type": ctype, "status": "True" if ctype in chosen else "False", "reason": reason,
                    "lastTransitionTime": self._iso()}
            if self.lws_version >= (0, 9):
                cond["observedGeneration"] = gen
            conds.append(cond)
        lws["status"] = {"replicas": leader_sts["status"]["replicas"], "readyReplicas": ready, "updatedReplicas": updated,
                         "conditions": conds}
        if self.lws_version >= (0, 9):
            lws["status"]["observedGeneration"] = gen

    # ---- Services and the EndpointSlice controller ---------------------------------------------------------------

    def apply_service(self, manifest):
        """``kubectl apply`` of a Service (ClusterIP, a selector, ports)."""
        obj = copy.deepcopy(manifest)
        obj["metadata"].update(namespace=self.ns, uid=self._new_uid(), creationTimestamp=self._iso())
        self.services[obj["metadata"]["name"]] = obj
        self._sync_endpointslice(obj)
        return obj

    def add_pod(self, pod):
        """A pod created outside the Deployment (by hand, or a leftover workload's): the kubelet runs it like any."""
        pod = copy.deepcopy(pod)
        pod["metadata"].update(namespace=self.ns, uid=self._new_uid(), creationTimestamp=self._iso())
        pod["metadata"].setdefault("ownerReferences", [{"apiVersion": "v1", "kind": "None", "uid": "-", "name": "-"}])
        pod.setdefault("status", {"phase": "Pending", "conditions": []})
        self.pods[pod["metadata"]["name"]] = pod
        return pod

    def _api_pods(self):
        return [copy.deepcopy(dict((k, v) for k, v in p.items() if not k.startswith("x"))) for p in self.pods.values()]

    def _seen(self, delay):
        """The pods as a watcher that trails the API by ``delay`` seconds last saw them."""
        if not delay or not self._history:
            return self._api_pods()
        past = [pods for t, pods in self._history if t <= self.t - delay]
        return past[-1] if past else self._history[0][1]

    def _sync_endpointslice(self, svc):
        selector = svc["spec"].get("selector") or {}
        name = svc["metadata"]["name"]
        endpoints = []
        for pod in self._seen(self.endpoints_delay):
            labels = pod["metadata"].get("labels") or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                continue
            if pod["status"].get("phase") in ("Succeeded", "Failed") or not pod["status"].get("podIP"):
                continue  # ShouldPodBeInEndpoints
            serving = self._ready(pod)
            terminating = bool(pod["metadata"].get("deletionTimestamp"))
            endpoints.append({"addresses": [pod["status"]["podIP"]],
                              "conditions": {"ready": serving and not terminating, "serving": serving,
                                             "terminating": terminating},
                              "nodeName": pod["spec"].get("nodeName"),
                              "targetRef": {"kind": "Pod", "namespace": self.ns, "name": pod["metadata"]["name"],
                                            "uid": pod["metadata"]["uid"]}})
        slice_name = "%s-%s" % (name, compute_hash({"svc": name})[:5])
        self.endpointslices[name] = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": slice_name, "namespace": self.ns,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                              "uid": svc["metadata"]["uid"], "controller": True}]},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],  # the engine container's named port
            "endpoints": endpoints}

    def clock(self):
        return self.t

    # ---- what a client reads -------------------------------------------------------------------------------------

    def objects(self):
        """Everything as the API shows it (``kubectl get deploy,rs,pods,events -o json`` items)."""
        pods = [dict((k, v) for k, v in p.items() if not k.startswith("x")) for p in self.pods.values()]
        others = [self._with_route_status(o) if o["kind"] == "HTTPRoute" else o for o in self.others.values()]
        return copy.deepcopy(list(self.deployments.values()) + list(self.replicasets.values()) + pods + self.events
                             + list(self.services.values()) + list(self.endpointslices.values())
                             + list(self.storms.values()) + list(self.rolesets.values())
                             + list(self.lwss.values()) + list(self.statefulsets.values()) + others)

    def _with_route_status(self, route):
        """The HTTPRoute with the status the gateway's controller writes for its parent (aibrix_oracle)."""
        oracle = aibrix_oracle.Cluster(list(self.services.values()) + list(self.others.values()))
        accepted, resolved = aibrix_oracle.route_conditions(oracle, route)
        out = copy.deepcopy(route)
        gen = route["metadata"]["generation"]
        conds = [{"type": "Accepted", "status": "True" if accepted == "Accepted" else "False", "reason": accepted,
                  "observedGeneration": gen, "lastTransitionTime": self._iso()},
                 {"type": "ResolvedRefs", "status": "True" if resolved == "ResolvedRefs" else "False",
                  "reason": resolved, "observedGeneration": gen, "lastTransitionTime": self._iso()}]
        out["status"] = {"parents": [{"parentRef": dict(p), "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
                                      "conditions": conds} for p in route["spec"].get("parentRefs") or []]}
        return out

    def fetch(self):
        """What ``k8s_engine_wait`` reads in one poll."""
        objs = self.objects()
        dep = next(iter(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet", "StormService")), None)
        svc = next(iter(self.services), None)
        return dict(pods=[o for o in objs if o["kind"] == "Pod"], route=None, workload=dep,
                    replicasets=[o for o in objs if o["kind"] == "ReplicaSet"],
                    controllers=[o for o in objs if o["kind"] in ("StatefulSet", "RoleSet")],
                    events=[o for o in objs if o["kind"] == "Event"],
                    endpointslices=[o for o in objs if o["kind"] == "EndpointSlice"] if svc else None,
                    service="%s/%s" % (self.ns, svc) if svc else None,
                    # every API answer carries the server's clock (RFC 9110 section 6.6.1 Date, which Go's net/http
                    # server behind kube-apiserver always sets)
                    dates=[email.utils.formatdate(self.clock(), usegmt=True)])

    def gateway_completion(self, model="glm-5.2-fp8-vllm", strategy=None):
        """``(status, response headers)`` of one ``POST /v1/completions`` through AIBrix's gateway, or None when
        nothing could answer (no routable pod, no ready endpoint)."""
        self._answers += 1
        if strategy:
            routable = sorted((p for p in self._seen(self.gateway_delay)
                               if (p["metadata"].get("labels") or {}).get(aibrix_oracle.NAME) == model
                               and p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
                               and self._ready(p)), key=lambda p: p["metadata"]["name"])
            if not routable:
                return None
            # with gateway_rng, AIBrix's random strategy: a uniform pick (pkg/plugins/gateway/algorithms/random.go,
            # rand.Intn over the model's routable pods); without, each pod in turn
            pod = routable[self.gateway_rng.randrange(len(routable)) if self.gateway_rng else self._answers % len(routable)]
            return 200, aibrix_oracle.response_headers(strategy, pod["metadata"]["name"], pod["status"]["podIP"],
                                                       request_id="req-%d" % self._answers)
        eps = [e for sl in self.endpointslices.values() for e in sl["endpoints"] if e["conditions"]["ready"]]
        if not eps:
            return None
        return 200, aibrix_oracle.response_headers(None, request_id="req-%d" % self._answers)

    def models(self):
        """``GET /v1/models`` through the Service: one Ready, non-terminating pod in turn answers, or None."""
        ready = sorted((p for p in self.pods.values() if self._ready(p) and not p["metadata"].get("deletionTimestamp")),
                       key=lambda p: p["metadata"]["name"])
        if not ready:
            return None
        self._answers += 1
        pod = ready[self._answers % len(ready)]
        path, _engine = self._engine_of(pod)
        return {"object": "list", "data": [{"id": "glm-5.2-fp8-vllm", "object": "model", "root": path}]}


def n_spec(pod):
    """The spec of a kube_scheduler pod tuple ``(owner, labels, namespace, spec)``."""
    return pod[3]


def service(name="glm-5-2-fp8-vllm"):
    """The engine's Service as the collection renders it: ClusterIP, selecting the engine pods, port 8000."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                     "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]}}


def deployment(model_path, name="glm-5-2-fp8-vllm", replicas=1, image="vllm/vllm-openai:v0.11.0"):
    """An engine Deployment as the collection renders it: RollingUpdate with maxSurge 0 / maxUnavailable 1, a
    startup probe sized for the cold start, liveness and readiness behind it."""
    labels = {"app.kubernetes.io/name": name, "model.aibrix.ai/name": "glm-5.2-fp8-vllm"}
    http = {"path": "/health", "port": "http"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": replicas, "progressDeadlineSeconds": 5400,
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                 "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [{
                     "name": "engine", "image": image, "command": ["vllm", "serve"],
                     "args": ["--model", model_path, "--served-model-name", "glm-5.2-fp8-vllm", "--port", "8000"],
                     "ports": [{"name": "http", "containerPort": 8000}],
                     "startupProbe": {"httpGet": http, "periodSeconds": 10, "failureThreshold": 60},
                     "readinessProbe": {"httpGet": http, "periodSeconds": 10, "failureThreshold": 3},
                     "livenessProbe": {"httpGet": http, "periodSeconds": 10, "failureThreshold": 3}}]}}},
    }
