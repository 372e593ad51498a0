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


def service_name(model_name):
    """The Service name for a served model: the model name itself when legal, else a derived one."""
    return dns1035_name(model_name)


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
