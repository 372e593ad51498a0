# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: Kubernetes name rules and the names derived from a served model name.

Rules (k8s.io/apimachinery ``pkg/util/validation/validation.go``):

* DNS-1123 label: ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63 characters.
* DNS-1123 subdomain: DNS-1123 labels joined by ``.``, at most 253 characters (Deployment, Pod,
  HTTPRoute, ReferenceGrant names).
* DNS-1035 label: ``[a-z]([-a-z0-9]*[a-z0-9])?``, at most 63 characters (Service names).
* Label values: at most 63 characters, ``(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?``.

AIBrix up to v0.7.0 looks a model up through the HTTPRoute ``<model>-router`` in the gateway namespace
and its controller points that route at a Service named exactly the model, which is impossible when
the model name has a dot (``glm-5.2-fp8-vllm``). The fix used here keeps the route name and points its
backendRef at a Service whose name is derived from the model name by :func:`service_name`.

Every object name derived from a served model name comes from :func:`object_name` (:func:`object_names` lists
them all): the served name itself when it is already a DNS-1035 label that fits, else its DNS-1035 spelling
followed by ``-<8 hex of sha256(served name)>``. The rewrite is lossy (``glm-5.2-fp8`` and ``glm-5-2-fp8`` spell
the same), so without the hash two models would render, and overwrite, the same Deployment and Service. A name
that is kept as it is never ends like a tagged one (``-<8 hex>``) nor like a role's object (``-prefill``,
``-decode``, ``-pd-proxy``, ``-sglang-router``), so a kept name is never another model's derived one; every
suffix is inside the 63 characters. No other file derives a Kubernetes name (``test_k8s_names.py`` scans for it).
"""
from __future__ import annotations

import hashlib
import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_MAX = 63
LABEL_VALUE_MAX = 63
HASH_LEN = 8

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_INVALID_RUN = re.compile(r"[^a-z0-9]+")


def is_dns1123_label(name):
    return isinstance(name, str) and len(name) <= DNS1123_LABEL_MAX and bool(_DNS1123_LABEL.match(name))


def is_dns1123_subdomain(name):
    if not isinstance(name, str) or not name or len(name) > DNS1123_SUBDOMAIN_MAX:
        return False
    return all(_DNS1123_LABEL.match(part) for part in name.split("."))


def is_dns1035_label(name):
    return isinstance(name, str) and len(name) <= DNS1035_LABEL_MAX and bool(_DNS1035_LABEL.match(name))


def is_label_value(value):
    return isinstance(value, str) and len(value) <= LABEL_VALUE_MAX and bool(_LABEL_VALUE.match(value))


def short_hash(text, length=HASH_LEN):
    """First ``length`` hex digits of sha256(text): stable across hosts and Python versions."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def dns1035_name(name, max_len=DNS1035_LABEL_MAX, prefix="m"):
    """Derive a valid DNS-1035 label from any string, deterministically.

    Lowercases, turns every run of characters outside ``[a-z0-9]`` into one ``-``, trims ``-`` at both
    ends, and prepends ``<prefix>-`` when the result does not start with a letter. A name longer than
    ``max_len`` is cut and gets ``-<8 hex of sha256(original)>`` so two long names that share a prefix
    stay distinct. A name that is already valid is returned unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("cannot derive a Kubernetes name from an empty value")
    if is_dns1035_label(name) and len(name) <= max_len:
        return name
    base = _INVALID_RUN.sub("-", name.lower()).strip("-")
    if not base:
        return "%s-%s" % (prefix, short_hash(name))
    if not base[0].isalpha():
        base = "%s-%s" % (prefix, base)
    if len(base) > max_len:
        keep = max_len - HASH_LEN - 1
        base = "%s-%s" % (base[:keep].rstrip("-"), short_hash(name))
    return base


#: What the collection appends to a served model's object name in the engine namespace: the P/D roles'
#: Deployments and Services, the vLLM proxy (Deployment, ConfigMap) and SGLang's router (Deployment,
#: ServiceAccount, Role, RoleBinding).
ROLE_SUFFIXES = ("prefill", "decode", "pd-proxy", "sglang-router")
_TAGGED = re.compile(r"-[0-9a-f]{%d}$" % HASH_LEN)

# AIBrix v0.7.0 names a StormService's RoleSets GenerateName ``<storm>-roleset-`` (the API server appends 5
# characters; pkg/controller/stormservice/rolesetoperations.go renderRoleSet) and the pods of a stateful role
# ``<roleset>-<role>-<templateHash>-<index>``, setting ``spec.hostname`` to that name
# (pkg/controller/roleset/utils.go renderStormServicePod); templateHash is ComputeHash's ShortSafeEncodeString of
# an FNV-32a, at most 10 characters (pkg/controller/util/controller_utils.go). A hostname is a DNS-1123 label of at
# most 63 characters (k8s.io/kubernetes pkg/apis/core/validation ValidatePodSpec). With the longest role
# ("prefill") and up to 99 replicas per role: 63 - len("-roleset-xxxxx-prefill-") - 10 - len("-99") = 27.
STORMSERVICE_NAME_MAX = DNS1035_LABEL_MAX - len("-roleset-xxxxx-prefill-") - 10 - len("-99")


def _spelling(name):
    """The DNS-1035 spelling of ``name`` (no length limit): lowercased, every run outside ``[a-z0-9]`` one ``-``,
    ``-`` trimmed, ``m-`` in front when it does not start with a letter."""
    base = _INVALID_RUN.sub("-", name.lower()).strip("-")
    if not base:
        return "m"
    return base if base[0].isalpha() else "m-" + base


def kept_as_is(served_name):
    """``served_name`` names its objects unchanged: a DNS-1035 label that cannot be read as another model's
    derived name (it does not end in ``-<8 hex>`` nor in ``-<role suffix>``)."""
    return (is_dns1035_label(served_name) and not _TAGGED.search(served_name)
            and not any(served_name.endswith("-" + s) for s in ROLE_SUFFIXES))


def object_name(served_name, suffix=None, max_len=DNS1035_LABEL_MAX):
    """The DNS-1035 name of one object of the model ``served_name``: ``<stem>`` or ``<stem>-<suffix>``, at most
    ``max_len`` characters with the suffix.

    The stem is ``served_name`` itself when :func:`kept_as_is` and short enough; else its DNS-1035 spelling, cut to
    fit, followed by ``-<8 hex of sha256(served_name)>``: the spelling is lossy (``glm-5.2-fp8`` and
    ``glm-5-2-fp8``), the hash of the original keeps two models' objects apart.
    """
    if not isinstance(served_name, str) or not served_name:
        raise ValueError("served_model_name: cannot derive a Kubernetes name from an empty value")
    if suffix is not None and suffix not in ROLE_SUFFIXES:
        raise ValueError("suffix: %r is not one of %s" % (suffix, ", ".join(ROLE_SUFFIXES)))
    tail = "-" + suffix if suffix else ""
    budget = max_len - len(tail)
    if kept_as_is(served_name) and len(served_name) <= budget:
        return served_name + tail
    keep = budget - HASH_LEN - 1
    if keep < 1:
        raise ValueError("max_len: %d leaves no room for a name with %r and a hash" % (max_len, tail))
    return "%s-%s%s" % (_spelling(served_name)[:keep].rstrip("-"), short_hash(served_name), tail)


def service_name(model_name):
    """The Service name for a served model (:func:`object_name`): the model name itself when kept as it is."""
    return object_name(model_name)


def legacy_service_name(model_name):
    """The Service name versions before :func:`object_name` derived (the DNS-1035 spelling, no hash): what a cluster
    set up by them still runs, and what ``engine_diagnose`` recognises there."""
    return dns1035_name(model_name)


def stormservice_name(model_name):
    """The StormService of a served model: :func:`object_name` within :data:`STORMSERVICE_NAME_MAX`, so that the
    pods AIBrix names after it have hostnames of at most 63 characters."""
    return object_name(model_name, max_len=STORMSERVICE_NAME_MAX)


def object_names(model_name, gateway_namespace="aibrix-system"):
    """Every name the collection derives from ``model_name``, by what it names (the HTTPRoute is
    :func:`route_name`, a DNS-1123 subdomain in the gateway namespace)."""
    svc = service_name(model_name)
    out = {"service": svc, "leaderworkerset": statefulset_safe_name(svc), "stormservice": stormservice_name(model_name),
           "reference_grant": reference_grant_name(svc, gateway_namespace)}
    out.update((s, object_name(model_name, s)) for s in ROLE_SUFFIXES)
    return out


def route_name(model_name):
    """AIBrix (<= v0.7.0) looks the model up as ``<model>-router``; the name must be a DNS-1123 subdomain."""
    name = "%s-router" % model_name
    if not is_dns1123_subdomain(name):
        raise ValueError(
            "served_model_name: %r gives the HTTPRoute name %r, which is not a valid DNS-1123 subdomain "
            "(lowercase letters, digits, '-' and '.', at most 253 characters). The AIBrix gateway looks the "
            "route up by exactly that name, so no route can work; use a lowercase served model name."
            % (model_name, name)
        )
    return name


# LeaderWorkerSet names its worker StatefulSets <lws>-<group index> and the StatefulSet controller labels every
# pod controller-revision-hash=<statefulset>-<10-character hash>, a label value of at most 63 characters; a
# LeaderWorkerSet name of at most 45 characters leaves room for 99999 groups.
STATEFULSET_BASE_MAX = 45


def statefulset_safe_name(name, max_len=STATEFULSET_BASE_MAX):
    """``name`` when short enough to base StatefulSet pod names on, else cut with an 8-hex hash of ``name``."""
    return dns1035_name(name, max_len=max_len)


def reference_grant_name(service, gateway_namespace):
    """Name of the ReferenceGrant that lets routes in ``gateway_namespace`` reach ``service``.

    Distinct from AIBrix's own ``<gw-ns>-reserved-referencegrant-in-<ns>`` so that neither removes the
    other; a DNS-1123 subdomain, hashed when too long.
    """
    name = "%s-from-%s" % (service, gateway_namespace)
    if len(name) > DNS1123_LABEL_MAX:
        name = "%s-%s" % (name[: DNS1123_LABEL_MAX - HASH_LEN - 1].rstrip("-"), short_hash(name))
    return name


def check_model_name(model_name):
    """Return a list of problems with ``model_name`` as an AIBrix model name (empty when fine)."""
    problems = []
    if not is_label_value(model_name):
        problems.append(
            "served_model_name: %r is not a valid Kubernetes label value (at most 63 characters of "
            "letters, digits, '-', '_' and '.', starting and ending with a letter or digit); AIBrix reads "
            "the model name from the pod label model.aibrix.ai/name, so it must be one" % (model_name,)
        )
    try:
        route_name(model_name)
    except ValueError as e:
        problems.append(str(e))
    return problems
