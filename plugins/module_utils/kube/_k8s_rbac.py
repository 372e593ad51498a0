# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the Kubernetes permissions the collection's API calls need, as RBAC objects.

:data:`ACCESS` is the one list of what the collection does to the API, by identity:

* ``read`` - what ``k8s_engine_wait`` and ``engine_diagnose`` read (get/list/watch and
  ``pods/log``): the identity of a diagnose run (an AWX diagnose template's credential);
* ``deploy`` - everything ``read`` does (the roles wait and diagnose after they apply) plus what the roles apply
  with ``kubernetes.core.k8s`` (``state: present, apply: true``: GET, then POST or PATCH; ``state: absent``: DELETE)
  and read with ``kubernetes.core.k8s_info`` / ``k8s_log``: the engine, P/D and upgrade roles and the benchmark's
  Job mode.

:func:`rbac_objects` renders them as ServiceAccounts, Roles and RoleBindings in the engine namespace, a Role and
RoleBinding in the gateway namespace (the HTTPRoute lives there) and, for ``deploy`` only, a ClusterRole and
ClusterRoleBinding to list nodes and pods (the upgrade planner counts the GPUs every pod holds on each node).

Restated from the Kubernetes RBAC reference (https://kubernetes.io/docs/reference/access-authn-authz/rbac/):
a Role's rules are additive and apply in its namespace only; a subresource is named ``<resource>/<sub>``
(``pods/log``); creating a Role or RoleBinding needs every permission it grants or ``escalate``/``bind`` (the P/D
router's Role grants get/list/watch on pods, which ``deploy`` holds, so neither is needed). Verbs per request are
those of ``k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``: GET of a collection is ``list``, of one object
``get``; POST ``create``; PATCH ``patch``; DELETE ``delete``. Discovery (``/api``, ``/apis``, ``/version``) is
allowed to every authenticated user by the default ``system:discovery`` ClusterRole.

tests/unit/plugins/module_utils/kube/test_k8s_rbac.py records every request the wait and the diagnosis make and
scans the roles and the renderers for kinds: a call or kind without a rule here fails there.
"""
from __future__ import annotations

import copy

READ, DEPLOY = "read", "deploy"
IDENTITIES = (READ, DEPLOY)
#: where a rule applies: the engine namespace, the gateway namespace, or cluster-wide
NAMESPACE, GATEWAY, CLUSTER = "namespace", "gateway_namespace", "cluster"

READ_VERBS = ("get", "list", "watch")
APPLY_VERBS = ("get", "list", "watch", "create", "patch", "delete")

#: Kind -> (apiGroup, resource, namespaced): every kind the collection applies, reads or deletes.
KINDS = {
    "Pod": ("", "pods", True),
    "Event": ("", "events", True),
    "Service": ("", "services", True),
    "ConfigMap": ("", "configmaps", True),
    "ServiceAccount": ("", "serviceaccounts", True),
    "Node": ("", "nodes", False),
    "Deployment": ("apps", "deployments", True),
    "ReplicaSet": ("apps", "replicasets", True),
    "StatefulSet": ("apps", "statefulsets", True),
    "Job": ("batch", "jobs", True),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets", True),
    "EndpointSlice": ("discovery.k8s.io", "endpointslices", True),
    "Role": ("rbac.authorization.k8s.io", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings", True),
    "HTTPRoute": ("gateway.networking.k8s.io", "httproutes", True),
    "ReferenceGrant": ("gateway.networking.k8s.io", "referencegrants", True),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "leaderworkersets", True),
    "StormService": ("orchestration.aibrix.ai", "stormservices", True),
    "RoleSet": ("orchestration.aibrix.ai", "rolesets", True),
    "EnvoyPatchPolicy": ("gateway.envoyproxy.io", "envoypatchpolicies", True),
    "EnvoyExtensionPolicy": ("gateway.envoyproxy.io", "envoyextensionpolicies", True),
}

#: ``(identity, where, apiGroup, resources, verbs, who needs it)``; ``deploy`` holds every ``read`` rule too.
ACCESS = (
    (READ, NAMESPACE, "", ("pods", "events", "services"), READ_VERBS,
     "k8s_engine_wait, engine_diagnose: the engine's pods, their Events and FailedCreate Events, its Service"),
    (READ, NAMESPACE, "", ("pods/log",), ("get",),
     "k8s_engine_wait, engine_diagnose: the current and previous log of a failed container"),
    (READ, NAMESPACE, "apps", ("deployments", "replicasets", "statefulsets"), READ_VERBS,
     "k8s_engine_wait, engine_diagnose: the workload's rollout and the controllers that create its pods"),
    (READ, NAMESPACE, "discovery.k8s.io", ("endpointslices",), READ_VERBS,
     "k8s_engine_wait, engine_diagnose: which pods the Service sends to"),
    (READ, NAMESPACE, "gateway.networking.k8s.io", ("httproutes", "referencegrants"), READ_VERBS,
     "engine_diagnose: the routes and the grant that lets the gateway's route reach the Service"),
    (READ, NAMESPACE, "leaderworkerset.x-k8s.io", ("leaderworkersets",), READ_VERBS,
     "k8s_engine_wait, engine_diagnose: a multi-node engine"),
    (READ, NAMESPACE, "orchestration.aibrix.ai", ("stormservices", "rolesets"), READ_VERBS,
     "k8s_engine_wait, engine_diagnose: a P/D StormService and its RoleSets"),
    (READ, GATEWAY, "gateway.networking.k8s.io", ("httproutes",), READ_VERBS,
     "k8s_engine_wait, engine_diagnose: the route's Accepted/ResolvedRefs conditions"),
    (DEPLOY, NAMESPACE, "", ("services", "configmaps", "serviceaccounts"), APPLY_VERBS,
     "engine, pd_disagg, upgrade: the Service; the P/D proxy's ConfigMap and the router's ServiceAccount"),
    (DEPLOY, NAMESPACE, "apps", ("deployments",), APPLY_VERBS,
     "engine, pd_disagg, upgrade: the engine, the P/D roles and the front"),
    (DEPLOY, NAMESPACE, "policy", ("poddisruptionbudgets",), APPLY_VERBS,
     "engine, upgrade: the budget of an engine with more than one replica"),
    (DEPLOY, NAMESPACE, "batch", ("jobs",), APPLY_VERBS,
     "benchmark (benchmark_mode apply): the client Job, read until it ends, then deleted"),
    (DEPLOY, NAMESPACE, "rbac.authorization.k8s.io", ("roles", "rolebindings"), APPLY_VERBS,
     "pd_disagg: the router's Role (get/list/watch pods, held by this identity) and its binding"),
    (DEPLOY, NAMESPACE, "gateway.networking.k8s.io", ("referencegrants",), APPLY_VERBS,
     "engine, pd_disagg: the grant from the gateway's HTTPRoute to the Service"),
    (DEPLOY, NAMESPACE, "leaderworkerset.x-k8s.io", ("leaderworkersets",), APPLY_VERBS,
     "engine, upgrade: a multi-node engine (engine_k8s_nodes > 1)"),
    (DEPLOY, NAMESPACE, "orchestration.aibrix.ai", ("stormservices",), APPLY_VERBS,
     "pd_disagg: the P/D pair as a StormService"),
    (DEPLOY, GATEWAY, "gateway.networking.k8s.io", ("httproutes",), APPLY_VERBS,
     "engine, pd_disagg, upgrade: the model's HTTPRoute in the gateway namespace"),
    (DEPLOY, GATEWAY, "gateway.envoyproxy.io", ("envoypatchpolicies", "envoyextensionpolicies"), ("get", "list"),
     "pd_disagg: the gateway's route and ext_proc timeouts (kubernetes.core.k8s_info)"),
    (DEPLOY, CLUSTER, "", ("nodes", "pods"), ("get", "list"),
     "upgrade: the GPUs allocated on each node by every pod (kubernetes.core.k8s_info, all namespaces)"),
)

#: The rendered names (a ServiceAccount, its Role(s), bindings) of each identity.
DEFAULT_NAMES = {DEPLOY: "llmops-deploy", READ: "llmops-read"}
MANAGED_BY = {"app.kubernetes.io/managed-by": "llmops.serving"}


def rules(identity, where):
    """The RBAC ``rules`` of ``identity`` (``read`` or ``deploy``) in ``where`` (:data:`NAMESPACE`,
    :data:`GATEWAY` or :data:`CLUSTER`), resources of one apiGroup with the same verbs merged, in a stable order."""
    if identity not in IDENTITIES:
        raise ValueError("identity: %r is not one of %s" % (identity, ", ".join(IDENTITIES)))
    held = (READ,) if identity == READ else IDENTITIES
    verbs_of = {}
    for who, scope, group, resources, verbs, _why in ACCESS:
        if who in held and scope == where:
            for resource in resources:
                verbs_of.setdefault((group, resource), set()).update(verbs)
    return _merged(verbs_of)


def _merged(verbs_of):
    """``{(apiGroup, resource): verbs}`` as rules: the resources of one apiGroup with the same verbs in one rule."""
    merged = {}
    for (group, resource), verbs in verbs_of.items():
        merged.setdefault((group, tuple(v for v in APPLY_VERBS if v in verbs)), []).append(resource)
    return [{"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
            for (group, verbs), resources in sorted(merged.items())]


def allows(rule_list, verb, group, resource):
    """Whether ``rule_list`` (RBAC rules) permits ``verb`` on ``group``/``resource`` (``pods/log`` for a
    subresource); ``*`` is honoured as RBAC does."""
    for rule in rule_list:
        if (group in rule.get("apiGroups", ()) or "*" in rule.get("apiGroups", ())) and \
                (resource in rule.get("resources", ()) or "*" in rule.get("resources", ())) and \
                (verb in rule.get("verbs", ()) or "*" in rule.get("verbs", ())):
            return True
    return False


def _meta(name, namespace=None):
    meta = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _binding(kind, name, namespace, role_kind, role, sa, sa_namespace):
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": _meta(name, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_namespace}]}


def rbac_objects(namespace, gateway_namespace, names=None):
    """The ServiceAccounts, Roles, RoleBindings (and ``deploy``'s ClusterRole/ClusterRoleBinding) of both
    identities; ``names`` maps ``deploy``/``read`` to the name of each identity's objects (:data:`DEFAULT_NAMES`).

    The gateway-namespace Role is merged into the engine namespace's when both are the same namespace. The
    ClusterRole is named ``<deploy name>-<namespace>`` so the identities of several namespaces do not overwrite
    each other's binding.
    """
    names = dict(DEFAULT_NAMES, **(names or {}))
    for key, value in (("namespace", namespace), ("gateway_namespace", gateway_namespace)) + \
            tuple(("names.%s" % k, v) for k, v in sorted(names.items())):
        if not isinstance(value, str) or not value:
            raise ValueError("%s: must be a non-empty name, got %r" % (key, value))
    if set(names) != set(IDENTITIES) or names[READ] == names[DEPLOY]:
        raise ValueError("names: give a distinct name to each of %s, got %r" % (", ".join(IDENTITIES), names))
    objects = []
    for identity in (DEPLOY, READ):
        name = names[identity]
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace)})
        where = [(namespace, rules(identity, NAMESPACE))]
        gateway_rules = rules(identity, GATEWAY)
        if gateway_namespace == namespace:
            where[0] = (namespace, _union(where[0][1], gateway_rules))
        elif gateway_rules:
            where.append((gateway_namespace, gateway_rules))
        for ns, rule_list in where:
            objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, ns),
                            "rules": rule_list})
            objects.append(_binding("RoleBinding", name, ns, "Role", name, name, namespace))
        cluster_rules = rules(identity, CLUSTER)
        if cluster_rules:
            cluster_name = "%s-%s" % (name, namespace)
            objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": _meta(cluster_name), "rules": cluster_rules})
            objects.append(_binding("ClusterRoleBinding", cluster_name, None, "ClusterRole", cluster_name, name, namespace))
    return copy.deepcopy(objects)


def _union(first, second):
    """Two rule lists as one, merged by apiGroup and verbs."""
    verbs_of = {}
    for rule in first + second:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs_of.setdefault((group, resource), set()).update(rule["verbs"])
    return _merged(verbs_of)
