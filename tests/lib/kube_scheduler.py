# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test model: where kube-scheduler can put the pods of a set of rendered objects, and whether their volumes mount.

Only the filters the collection's pods depend on are restated, each from the upstream file named beside it
(kubernetes/kubernetes at tag v1.33.0), without importing the collection's renderers, so a renderer cannot pass
by agreeing with itself:

* NodeAffinity (``pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`` Filter, with
  ``staging/src/k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go``
  ``GetRequiredNodeAffinity``/``RequiredNodeAffinity.Match``): ``nodeSelector`` labels must all equal the node's;
  ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` are ORed, a term with neither
  ``matchExpressions`` nor ``matchFields`` matches nothing (``isEmptyNodeSelectorTerm``), no usable term matches no
  node; the expressions of one term are ANDed (``In``, ``NotIn`` (true when the label is absent), ``Exists``,
  ``DoesNotExist``, ``Gt``/``Lt`` on integers: ``k8s.io/apimachinery/pkg/labels/selector.go``
  ``Requirement.Matches``); ``matchFields`` knows only ``metadata.name`` with ``In``/``NotIn`` of one value
  (``extractNodeFields``, ``nodeSelectorRequirementsAsFieldSelector``).
* TaintToleration (``pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go`` Filter): only taints with
  effect ``NoSchedule`` or ``NoExecute`` count; each must be tolerated (``FindMatchingUntoleratedTaint``), by the
  rule of ``staging/src/k8s.io/api/core/v1/toleration.go`` ``ToleratesTaint``: an effect, when given, must equal
  the taint's; a key, when given, must equal it (an empty key needs operator ``Exists``); ``Exists`` matches any
  value, ``Equal`` (the default) needs the same value.
* NodeResourcesFit (``pkg/scheduler/framework/plugins/noderesources/fit.go`` ``fitsRequest``): for every resource
  the pod requests (cpu, memory, ephemeral-storage and extended resources such as ``nvidia.com/gpu`` or
  ``rdma/...``), allocatable minus what the pods already on the node request must cover it, else
  ``Insufficient <resource>``; a resource the node does not list has allocatable 0. A container that gives only a
  limit requests the limit (``pkg/apis/core/v1/defaults.go`` ``SetDefaults_Pod``). The pod's request is the sum of
  its containers (``k8s.io/component-helpers/resource/helpers.go`` ``PodRequests``; init containers and overhead are
  not rendered here).
* InterPodAffinity, required anti-affinity only (``pkg/scheduler/framework/plugins/interpodaffinity/filtering.go``
  ``satisfyPodAntiAffinity``/``satisfyExistingPodsAntiAffinity``): a node is infeasible when a pod in the same
  topology domain (equal value of ``topologyKey`` on both nodes) matches the incoming pod's anti-affinity
  ``labelSelector`` in its namespace, or the incoming pod matches such a term of a pod already there.
* The kubelet's hostPath check (``pkg/volume/hostpath/host_path.go`` ``checkType``/``checkTypeInternal``), which
  runs at mount time, after scheduling: ``type: Directory`` on a path that is not a directory fails the mount with
  "hostPath type check failed: <path> is not a directory" (a FailedMount event; the pod stays
  ContainerCreating). ``DirectoryOrCreate`` creates it; an empty type checks nothing.

Pods are expanded from their workloads as their controllers create them: a Deployment's ``replicas`` pods, a
LeaderWorkerSet's ``replicas`` groups of one leader and ``size - 1`` workers (kubernetes-sigs/lws
``api/leaderworkerset/v1/leaderworkerset_types.go``), a StormService's roles (``replicas`` each).
"""
from __future__ import annotations

import re

QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_UNIT = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def quantity(value):
    m = QUANTITY.match(str(value))
    if not m:
        raise ValueError("%r is not a quantity" % (value,))
    return float(m.group(1)) * _UNIT[m.group(2)]


def node(name, labels=None, taints=(), allocatable=None, dirs=(), hostname=None):
    """A node: ``name`` is its ``metadata.name``; the kubelet's ``kubernetes.io/hostname`` label is its hostname,
    a separate value (``pkg/kubelet/kubelet_node_status.go`` initialNode: ``Name: kl.nodeName``, ``LabelHostname:
    kl.hostname``) that differs from the name where a cloud provider or ``--node-name`` names the node
    (kubernetes/kops#10413, rancher/rke#3140): ``hostname``, the name when not given (the kubelet's default, both
    from the machine's hostname). ``dirs``: the directories that exist on it."""
    labels = dict(labels or {})
    labels.setdefault("kubernetes.io/hostname", hostname or name)
    return dict(name=name, labels=labels, taints=[dict(t) for t in taints], allocatable=dict(allocatable or {}),
                dirs=set(dirs), pods=[])


# ------------------------------------------------------------------------------------------------ #
# Pods of the workloads
# ------------------------------------------------------------------------------------------------ #


def pods_of(objects):
    """``[(owner, labels, namespace, spec)]`` for every pod the workloads in ``objects`` create."""
    out = []
    for obj in objects:
        kind, meta, spec = obj.get("kind"), obj.get("metadata", {}), obj.get("spec", {})
        ns = meta.get("namespace") or "default"
        owner = "%s/%s" % (kind, meta.get("name"))
        if kind in ("Deployment", "StatefulSet", "ReplicaSet"):
            tpl = spec["template"]
            out += [(owner, tpl["metadata"].get("labels", {}), ns, tpl["spec"])] * int(spec.get("replicas", 1))
        elif kind == "LeaderWorkerSet":
            lwt = spec["leaderWorkerTemplate"]
            leader = lwt.get("leaderTemplate") or lwt["workerTemplate"]
            for _group in range(int(spec.get("replicas", 1))):
                out.append((owner + " leader", leader["metadata"].get("labels", {}), ns, leader["spec"]))
                worker = lwt["workerTemplate"]
                out += [(owner + " worker", worker["metadata"].get("labels", {}), ns, worker["spec"])] * (int(lwt.get("size", 1)) - 1)
        elif kind == "StormService":
            for role in spec["template"]["spec"]["roles"]:
                tpl = role["template"]
                out += [("%s %s" % (owner, role["name"]), tpl["metadata"].get("labels", {}), ns, tpl["spec"])] \
                    * int(role.get("replicas", 1))
        elif kind == "Job":
            tpl = spec["template"]
            out.append((owner, tpl["metadata"].get("labels", {}), ns, tpl["spec"]))
    return out


# ------------------------------------------------------------------------------------------------ #
# Filters
# ------------------------------------------------------------------------------------------------ #


def _expr_matches(expr, labels):
    key, op, values = expr["key"], expr["operator"], list(expr.get("values") or [])
    has = key in labels
    if op == "In":
        return has and labels[key] in values
    if op == "NotIn":
        return not has or labels[key] not in values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt"):
        if not has or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError("operator %r is not supported" % op)


def _term_matches(term, n):
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False
    if not all(_expr_matches(e, n["labels"]) for e in exprs):
        return False
    for f in fields:
        if f["key"] != "metadata.name" or f["operator"] not in ("In", "NotIn") or len(f.get("values") or []) != 1:
            return False
        if (n["name"] == f["values"][0]) != (f["operator"] == "In"):
            return False
    return True


def node_affinity(spec, n):
    """NodeAffinity Filter: ``None`` when the node fits, else the scheduler's reason."""
    for key, value in (spec.get("nodeSelector") or {}).items():
        if n["labels"].get(key) != value:
            return "node(s) didn't match Pod's node affinity/selector"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None:
        if not any(_term_matches(t, n) for t in required.get("nodeSelectorTerms") or []):
            return "node(s) didn't match Pod's node affinity/selector"
    return None


def tolerates(tol, taint):
    if tol.get("effect") and tol["effect"] != taint["effect"]:
        return False
    if tol.get("key") and tol["key"] != taint["key"]:
        return False
    op = tol.get("operator") or "Equal"
    if not tol.get("key") and op != "Exists":
        return False
    if op == "Exists":
        return True
    return (tol.get("value") or "") == (taint.get("value") or "")


def taint_toleration(spec, n):
    for taint in n["taints"]:
        if taint["effect"] not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in spec.get("tolerations") or []):
            return "node(s) had taint {%s: %s}, that the pod didn't tolerate" % (taint["key"], taint.get("value", ""))
    return None


def pod_requests(spec):
    total = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        requests = dict(res.get("limits") or {})
        requests.update(res.get("requests") or {})
        for name, value in requests.items():
            total[name] = total.get(name, 0.0) + quantity(value)
    return total


def resources_fit(spec, n):
    used = {}
    for _labels, _ns, placed in n["pods"]:
        for name, value in pod_requests(placed).items():
            used[name] = used.get(name, 0.0) + value
    for name, want in sorted(pod_requests(spec).items()):
        have = quantity(n["allocatable"].get(name, 0)) - used.get(name, 0.0)
        if want > have + 1e-9:
            return "Insufficient %s" % name
    return None


def _selector_matches(selector, labels):
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_expr_matches(e, labels) for e in selector.get("matchExpressions") or [])


def _anti_terms(spec):
    return (((spec.get("affinity") or {}).get("podAntiAffinity") or {})
            .get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def pod_anti_affinity(labels, ns, spec, n, nodes):
    for term in _anti_terms(spec):
        key = term["topologyKey"]
        if key not in n["labels"]:
            continue
        for other in nodes:
            if other["labels"].get(key) != n["labels"][key]:
                continue
            for o_labels, o_ns, _o_spec in other["pods"]:
                if o_ns in (term.get("namespaces") or [ns]) and _selector_matches(term.get("labelSelector"), o_labels):
                    return "node(s) didn't match pod anti-affinity rules"
    for other in nodes:
        for o_labels, o_ns, o_spec in other["pods"]:
            for term in _anti_terms(o_spec):
                key = term["topologyKey"]
                if key in n["labels"] and other["labels"].get(key) == n["labels"][key] \
                        and ns in (term.get("namespaces") or [o_ns]) and _selector_matches(term.get("labelSelector"), labels):
                    return "node(s) didn't satisfy existing pods anti-affinity rules"
    return None


def reasons(pod, n, nodes):
    """Every filter's reason the node cannot take ``pod`` (``(owner, labels, namespace, spec)``); [] = it fits."""
    _owner, labels, ns, spec = pod
    out = [node_affinity(spec, n), taint_toleration(spec, n), resources_fit(spec, n),
           pod_anti_affinity(labels, ns, spec, n, nodes)]
    return [r for r in out if r]


def feasible(pod, nodes):
    return [n["name"] for n in nodes if not reasons(pod, n, nodes)]


# ------------------------------------------------------------------------------------------------ #
# The kubelet's mount
# ------------------------------------------------------------------------------------------------ #


def mount_errors(spec, n):
    """The hostPath type check of ``pkg/volume/hostpath/host_path.go`` on node ``n``."""
    errors = []
    for vol in spec.get("volumes") or []:
        hp = vol.get("hostPath")
        if not hp or hp.get("type") != "Directory":
            continue
        path = hp["path"].rstrip("/") or "/"
        if path not in n["dirs"] and not any(d.startswith(path + "/") for d in n["dirs"]):
            errors.append("hostPath type check failed: %s is not a directory" % hp["path"])
    return errors


def schedule(objects, nodes):
    """Place every pod of ``objects`` in order, each on the first feasible node by name (the scheduler scores
    among the feasible ones; every feasible choice must work). Returns ``[(owner, node name or None, reasons)]``."""
    placed = []
    for pod in pods_of(objects):
        fits = sorted(feasible(pod, nodes))
        if not fits:
            why = sorted({r for n in nodes for r in reasons(pod, n, nodes)})
            placed.append((pod[0], None, why))
            continue
        target = [n for n in nodes if n["name"] == fits[0]][0]
        target["pods"].append((pod[1], pod[2], pod[3]))
        placed.append((pod[0], target["name"], mount_errors(pod[3], target)))
    return placed
