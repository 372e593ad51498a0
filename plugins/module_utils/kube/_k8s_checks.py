# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the checks of an engine pod's inputs, before any object is built from them.

A bad input raises :class:`SpecError` naming the field and the fix; the engine's objects (:mod:`_k8s_engine`), the
P/D pair's (:mod:`_pd_manifests`) and the benchmark Job run the same checks.

* :func:`validate` - every engine input of :data:`_k8s_engine.DEFAULTS`, credentials first (no later message can
  then quote one); normalises ``env``, ``rdma`` and ``staged_nodes`` in place.
* :func:`check_tolerations`, :func:`check_topology_spread`, :func:`check_quantity` / :func:`quantity_bytes`,
  :func:`check_command` (the engine is the container's main process), :func:`init_flavour`,
  :func:`check_credentials` (the one rule of :mod:`_secrets`), :func:`check_args` (flags the collection sets),
  :func:`flag_name` (the flag a command-line word sets).
* :func:`check_shm_size`, :func:`check_hf_token_secret`, :func:`check_image_pull_secret` - the pod inputs the
  engine and the P/D pair take alike.
* :func:`version_key`, :func:`parse_image`, :func:`profiles_table`, :func:`profile_entry`, :func:`check_image` -
  engine profiles, versions and images: an image too old for its profile is refused, and so is an image of the
  other engine's project (:func:`check_engine_image`, an engine switch with the old image).
* :func:`check_staged_nodes` - the nodes that staged the revision can hold the pods.
* :func:`check_rdma`, :func:`rdma_env` - the RDMA knobs, normalised, and the variables they set.
"""
from __future__ import annotations

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_command
from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

# Built-in engine profile: no tuning flags at all (a Llama user must not get GLM parsers). Tuned profiles are
# data (the engine role's vars/profiles.yml, extended by engine_k8s_profiles) passed in as ``profiles``.
BUILTIN_PROFILES = {
    "none": {
        "description": "no tuning flags; only what the collection manages (model, port, TP size, served name, loader)",
        "vllm": {"args": {}},
        "sglang": {"args": {}},
    },
}
PROFILE_KEYS = {"description", "vllm", "sglang"}
PROFILE_ENGINE_KEYS = {"min_version", "args"}

# Flags the collection sets itself: the served name must be byte-identical to the AIBrix label and the
# port to the probes and the Service, the parallel layout to the GPUs and nodes requested, so they cannot
# be overridden through engine_args/extra_args.
MANAGED_FLAGS = {
    "vllm": {"model", "host", "port", "tensor-parallel-size", "tp", "served-model-name", "pipeline-parallel-size",
             "pp", "nnodes", "node-rank", "master-addr", "master-port", "headless"},
    "sglang": {"model-path", "model", "host", "port", "tp-size", "tp", "served-model-name", "pp-size",
               "pipeline-parallel-size", "nnodes", "node-rank", "dist-init-addr"},
}

# Default loader threads per TP rank, by where the weights are read from.
LOADER_THREADS = {"staged_nvme": 8, "shared_fs": 2}

# vLLM's multiprocessing launcher serves one engine over several nodes without Ray from this release on
# (--nnodes/--node-rank/--master-addr; vllm-project/vllm PR #23691, docs/serving/parallelism_scaling.md).
VLLM_MULTINODE_MIN = "0.11.0"

# Docker Hub under its names (None: an image named without a registry); SGLang's images there are lmsysorg/sglang.
DOCKER_HUB = {None, "docker.io", "index.docker.io", "registry-1.docker.io"}

# Each engine project's own image repository (the path under any registry or mirror): vLLM's deployment docs
# (docs/deployment/docker.md: vllm/vllm-openai) and SGLang's install docs (docs/get_started/install.md:
# lmsysorg/sglang). One project's image never starts the other engine: its entrypoint and packages are its own.
ENGINE_IMAGE_REPOSITORIES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}

QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
SPREAD_KEYS = {"maxSkew", "topologyKey", "whenUnsatisfiable", "labelSelector", "minDomains", "nodeAffinityPolicy",
               "nodeTaintsPolicy", "matchLabelKeys"}
RDMA_KEYS = {"resource", "count", "networks", "host_network", "nccl_ib_hca", "socket_ifname"}


class SpecError(ValueError):
    """An input the objects cannot be built from; ``str()`` names the field and the fix.

    ``secret_values`` holds the plain-text credentials that were refused (for ``no_log_values``), never shown.
    """

    secret_values = ()


# --------------------------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------------------------- #


def check_tolerations(tolerations):
    """Refuse tolerations without a key: ``operator: Exists`` with no key tolerates every taint."""
    if not isinstance(tolerations, list):
        raise SpecError("tolerations: must be a list of toleration objects")
    for i, tol in enumerate(tolerations):
        where = "tolerations[%d]" % i
        if not isinstance(tol, dict):
            raise SpecError("%s: must be a mapping with key/operator/value/effect" % where)
        unknown = sorted(set(tol) - TOLERATION_KEYS)
        if unknown:
            raise SpecError("%s: unknown field(s) %s; allowed: %s" % (where, ", ".join(unknown), ", ".join(sorted(TOLERATION_KEYS))))
        operator = tol.get("operator", "Equal")
        if operator not in ("Exists", "Equal"):
            raise SpecError("%s: operator %r is not Exists or Equal" % (where, operator))
        if not tol.get("key"):
            if operator == "Exists":
                raise SpecError(
                    "%s: operator Exists without a key tolerates every taint, so the engine can land on "
                    "nodes isolated for other work; name the taint, e.g. {key: nvidia.com/gpu, operator: "
                    "Exists, effect: NoSchedule}" % where
                )
            raise SpecError("%s: a toleration must name the taint key it tolerates (field 'key')" % where)
        if operator == "Exists" and tol.get("value"):
            raise SpecError("%s: operator Exists takes no value; drop 'value' or use operator Equal" % where)
        effect = tol.get("effect")
        if effect and effect not in TOLERATION_EFFECTS:
            raise SpecError("%s: effect %r is not one of %s" % (where, effect, ", ".join(sorted(TOLERATION_EFFECTS))))
        if "tolerationSeconds" in tol and effect != "NoExecute":
            raise SpecError("%s: tolerationSeconds only applies to effect NoExecute" % where)


def check_command(command):
    """The engine must be the container's main process, so its exit status is the container's.

    The rule is engine_process's (``_process_command.command_problems``), applied without reading files of this host:
    ``start 2>&1 | tee log`` returns tee's 0 after the engine crashed, and Kubernetes then shows a crashed
    engine as Completed. A script whose last ``exec`` runs something that is not an engine (``...; exec true``)
    is refused too: the container's status would be that command's.
    """
    if not command:
        return
    if not isinstance(command, list) or not all(isinstance(c, str) and c for c in command):
        raise SpecError("command: must be a non-empty list of strings (exec form)")
    reasons = _process_command.command_problems(list(command), read_files=False)
    if reasons:
        raise SpecError(
            "command: the %s command wraps the engine in a way that masks its exit status (%s). A crashed engine "
            "would show as Completed/exit 0; run the engine directly (exec form) or 'exec' it as the last "
            "step of the script." % (os.path.basename(command[0]), "; ".join(reasons))
        )


def init_flavour(init):
    """``tini`` or ``dumb-init`` for an init path in the image; SpecError for anything else."""
    if not isinstance(init, str) or not init or any(c.isspace() for c in init):
        raise SpecError("init: %r is not the path of an init binary in the image (e.g. /usr/bin/tini)" % (init,))
    base = os.path.basename(init)
    if base == "tini" or base.startswith("tini-"):
        return "tini"
    if base == "dumb-init":
        return "dumb-init"
    raise SpecError(
        "init: %r is neither tini nor dumb-init. Name the one the image has (/usr/bin/tini, /usr/bin/dumb-init), "
        "or leave init unset: the pod then shares its process namespace, so the pause container is PID 1 and "
        "the engine is not" % (init,))


def check_quantity(field, value, cpu=False):
    if value is None or value == "":
        return
    text = str(value)
    if not QUANTITY.match(text) or (not cpu and text.endswith("m")):
        raise SpecError("%s: %r is not a Kubernetes quantity such as %s" % (field, value, "32 or 500m" if cpu else "256Gi"))


_UNITS = {"": 1, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18,
          "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def quantity_bytes(value):
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$", str(value))
    if not m or m.group(2) not in _UNITS:
        return None
    return float(m.group(1)) * _UNITS[m.group(2)]


def check_shm_size(value):
    """``shm_size``: unset, or a Kubernetes quantity (the ``/dev/shm`` emptyDir's size limit)."""
    if value and not QUANTITY.match(str(value)):
        raise SpecError("shm_size: %r is not a Kubernetes quantity such as 64Gi" % (value,))


def check_hf_token_secret(value):
    """``hf_token_secret``: unset, or ``{name, key}`` naming the Secret that ``HF_TOKEN`` is rendered from."""
    if value and not (isinstance(value, dict) and value.get("name")):
        raise SpecError("hf_token_secret: must be {name: <Secret>, key: <key>} naming an existing Secret")


def check_image_pull_secret(value):
    """``image_pull_secret``: unset, or the name of a Secret (DNS-1123 subdomain)."""
    if value and not names.is_dns1123_subdomain(value):
        raise SpecError("image_pull_secret: %r is not a Secret name" % (value,))


def check_topology_spread(spread, selector):
    """Validate topology spread constraints; fill maxSkew 1, ScheduleAnyway and the engine's pod selector."""
    if not isinstance(spread, list):
        raise SpecError("topology_spread: must be a list of topologySpreadConstraints")
    out = []
    for i, item in enumerate(spread):
        where = "topology_spread[%d]" % i
        if not isinstance(item, dict) or not isinstance(item.get("topologyKey"), str) or not item.get("topologyKey"):
            raise SpecError("%s: each constraint needs a topologyKey (e.g. kubernetes.io/hostname or "
                            "topology.kubernetes.io/zone)" % where)
        unknown = sorted(set(item) - SPREAD_KEYS)
        if unknown:
            raise SpecError("%s: unknown field(s) %s; allowed: %s" % (where, ", ".join(unknown), ", ".join(sorted(SPREAD_KEYS))))
        c = dict(item)
        c.setdefault("maxSkew", 1)
        c.setdefault("whenUnsatisfiable", "ScheduleAnyway")
        c.setdefault("labelSelector", {"matchLabels": dict(selector)})
        if not isinstance(c["maxSkew"], int) or isinstance(c["maxSkew"], bool) or c["maxSkew"] < 1:
            raise SpecError("%s: maxSkew must be an integer >= 1" % where)
        if c["whenUnsatisfiable"] not in ("DoNotSchedule", "ScheduleAnyway"):
            raise SpecError("%s: whenUnsatisfiable %r is not DoNotSchedule or ScheduleAnyway" % (where, c["whenUnsatisfiable"]))
        out.append(c)
    return out


def check_credentials(p):
    """Refuse plain-text credentials in everything that reaches the container; normalises ``p["env"]``."""
    for field, kind in (("engine_args", dict), ("kernel_cache_env", dict), ("extra_args", list)):
        if p[field] is not None and not isinstance(p[field], kind):
            raise SpecError("%s: must be a %s" % (field, "mapping" if kind is dict else "list"))
    scan = _secrets.Scan(env_field="env")
    scan.mapping(p["kernel_cache_env"], "kernel_cache_env")
    if p["hf_token_secret"]:
        scan.refs["HF_TOKEN"] = "secret"
    p["env"] = scan.env(p["env"] or [], "env", SpecError)
    scan.flags(p["engine_args"], "engine_args")
    scan.argv(p["extra_args"], "extra_args")
    if isinstance(p["command"], list):
        scan.command(p["command"], "command")
    scan.refuse(SpecError, hint="for the Hugging Face token, hf_token_secret renders HF_TOKEN from a Secret")


def flag_name(token):
    """The flag a command-line word sets (``--port=8000`` -> ``port``); None for a word that is no ``--`` flag."""
    return token[2:].split("=", 1)[0] if token.startswith("--") else None


def check_args(engine, engine_args, extra_args):
    managed = MANAGED_FLAGS[engine]
    for flag in engine_args:
        if flag.lstrip("-") in managed:
            raise SpecError(
                "engine_args: %r is set by the collection (served name, port, TP size and model path must "
                "match the AIBrix labels, probes and Service); use the dedicated variable instead" % flag
            )
    for tok in extra_args:
        if not isinstance(tok, str):
            raise SpecError("extra_args: every item must be a string, got %r" % (tok,))
        name = flag_name(tok)
        if name in managed or tok in ("-tp",):
            raise SpecError(
                "extra_args: %r is set by the collection; use the dedicated variable (served_model_name, "
                "port, tp_size, model_path) so labels, probes and Service stay consistent" % tok
            )


# --------------------------------------------------------------------------------------------- #
# Profiles, engine versions and images
# --------------------------------------------------------------------------------------------- #

_VERSION = re.compile(r"^v?(?P<release>[0-9]+(?:\.[0-9]+){1,3})(?:[-_.]?(?P<pre>a|b|rc)(?P<pren>[0-9]*))?"
                      r"(?:[-_.]?post(?P<post>[0-9]+))?(?:[-_.]?dev(?P<dev>[0-9]*))?(?P<rest>[-+].*)?$")
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}


def version_key(text):
    """A sortable key for a PEP 440-style version or image tag (``0.5.16b1``, ``v0.26.0-cu129``); None if none.

    Pre-releases sort before the release (``0.26.0b2.dev1 < 0.26.0b2 < 0.26.0``), ``.devN`` before its
    pre-release or release, ``.postN`` after. Anything after ``-`` or ``+`` (a CUDA flavour) is ignored.
    """
    m = _VERSION.match(str(text or ""))
    if not m:
        return None
    release = tuple(int(x) for x in m.group("release").split("."))
    release = release + (0,) * (4 - len(release))
    if m.group("pre"):
        pre = (_PRE_RANK[m.group("pre")], int(m.group("pren") or 0))
    elif m.group("dev") is not None and m.group("post") is None:
        pre = (-1, 0)
    else:
        pre = (3, 0)
    post = int(m.group("post")) if m.group("post") is not None else -1
    dev = int(m.group("dev") or 0) if m.group("dev") is not None else float("inf")
    return (release, pre, post, dev)


def parse_image(image):
    """``registry``, ``repository`` (Docker Hub names with ``library/``), ``tag`` and ``digest`` of an image."""
    ref, _sep, digest = str(image).partition("@")
    first, slash, rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = None, ref
    name, colon, tag = path.rpartition(":")
    if not colon or "/" in tag:
        name, tag = path, None
    if registry in DOCKER_HUB and "/" not in name:
        name = "library/" + name
    return dict(registry=registry, repository=name, tag=tag or None, digest=digest or None)


def profiles_table(profiles):
    """The built-in ``none`` profile plus ``profiles`` (validated); names the field of every problem."""
    if not isinstance(profiles, dict):
        raise SpecError("profiles: must be a mapping of profile name to {description, vllm, sglang}")
    table = dict(BUILTIN_PROFILES)
    for name, prof in profiles.items():
        where = "profiles.%s" % name
        if name == "none":
            raise SpecError("%s: 'none' is built in (no tuning flags) and cannot be redefined; give the profile "
                            "another name" % where)
        if not isinstance(prof, dict):
            raise SpecError("%s: must be a mapping with description, vllm and/or sglang" % where)
        unknown = sorted(set(prof) - PROFILE_KEYS)
        if unknown:
            raise SpecError("%s: unknown key(s) %s; a profile has %s" % (where, ", ".join(unknown), ", ".join(sorted(PROFILE_KEYS))))
        for engine in ("vllm", "sglang"):
            entry = prof.get(engine)
            if entry is None:
                continue
            ew = "%s.%s" % (where, engine)
            if not isinstance(entry, dict) or sorted(set(entry) - PROFILE_ENGINE_KEYS):
                raise SpecError("%s: must be a mapping with min_version and args" % ew)
            if not isinstance(entry.get("args", {}), dict):
                raise SpecError("%s.args: must be a mapping of flag (without --) to value" % ew)
            if entry.get("min_version") is not None and version_key(entry["min_version"]) is None:
                raise SpecError("%s.min_version: %r is not a version such as 0.5.16b1" % (ew, entry["min_version"]))
            for flag in entry.get("args", {}):
                if str(flag).lstrip("-") in MANAGED_FLAGS[engine]:
                    raise SpecError("%s.args: %r is set by the collection (served name, port, parallel layout and "
                                    "model path); remove it from the profile" % (ew, flag))
        table[name] = prof
    return table


def profile_entry(profiles, name, engine):
    """``(flag pairs, min_version or None)`` of profile ``name`` for ``engine``."""
    table = profiles_table(profiles or {})
    if name not in table:
        raise SpecError(
            "profile: %r is not defined (known: %s). Profiles are data: the engine role's vars/profiles.yml and "
            "engine_k8s_profiles (module option profiles)" % (name, ", ".join(sorted(table))))
    entry = table[name].get(engine)
    if entry is None:
        raise SpecError("profile: %r has no %s entry (it is tuned for %s only); use profile none or add one"
                        % (name, engine, ", ".join(e for e in ("vllm", "sglang") if e in table[name])))
    return list((entry.get("args") or {}).items()), entry.get("min_version")


def check_engine_image(engine, image, ref=None, field="image"):
    """Refuse an image of the other engine's project (:data:`ENGINE_IMAGE_REPOSITORIES`): ``engine: sglang``
    with ``vllm/vllm-openai`` (under any registry), or ``engine: vllm`` with ``lmsysorg/sglang``."""
    ref = ref or parse_image(image)
    for other, repository in sorted(ENGINE_IMAGE_REPOSITORIES.items()):
        if other != engine and (ref["repository"] == repository or ref["repository"].endswith("/" + repository)):
            raise SpecError("%s: %s is %s's image (%s), it cannot run engine %s; use a %s image (%s) or set the "
                            "engine to %s" % (field, image, other, repository, engine, engine,
                                              ENGINE_IMAGE_REPOSITORIES.get(engine, "its project's"), other))


def check_image(engine, image, min_version=None, profile="none", nodes=1):
    """Refuse an image that cannot run this profile; return warnings for what cannot be checked.

    * SGLang's images are ``lmsysorg/sglang``; ``lmsys/sglang`` on Docker Hub is not the project's.
    * A tag whose version is older than the profile's ``min_version`` is refused (vLLM multi-node needs
      :data:`VLLM_MULTINODE_MIN`); a tag without a version (``latest``) or a digest-only image warns.
    * A tag without a digest warns: the tag can move to another build between two pods of one rollout.
    """
    ref = parse_image(image)
    warnings = []
    if engine == "sglang" and ref["registry"] in DOCKER_HUB and ref["repository"] == "lmsys/sglang":
        raise SpecError("image: %r is not SGLang's image; the project publishes lmsysorg/sglang (for example "
                        "lmsysorg/sglang:v0.5.16), lmsys/sglang on Docker Hub is another account" % (image,))
    other = "sglang" if engine == "vllm" else "vllm"
    check_engine_image(engine, image, ref)
    short = ref["repository"].rsplit("/", 1)[-1]
    if other in short and engine not in short:
        warnings.append("image: %s looks like a %s image but engine is %s" % (image, other, engine))
    needs = []
    if min_version:
        needs.append((min_version, "profile %s" % profile))
    if engine == "vllm" and nodes > 1:
        needs.append((VLLM_MULTINODE_MIN, "multi-node serving without Ray (--nnodes/--node-rank/--master-addr)"))
    have = version_key(ref["tag"]) if ref["tag"] else None
    for need, why in needs:
        if have is None:
            warnings.append("image: the %s version of %s cannot be read from its %s; %s needs %s %s or newer, "
                            "check the image" % (engine, image, "tag %r" % ref["tag"] if ref["tag"] else "digest",
                                                 why, engine, need))
        elif have < version_key(need):
            raise SpecError("image: %s is %s %s, older than %s needs (%s or newer); use a newer image%s"
                            % (image, engine, ref["tag"], why, need,
                               " or profile none with your own engine_args" if min_version and "profile" in why else ""))
    if ref["tag"] and not ref["digest"]:
        warnings.append("image: %s is pinned by tag only; a tag can be moved to another build between two pods of "
                        "one rollout. Pin it by digest (%s@sha256:...)" % (image, image))
    return warnings


# --------------------------------------------------------------------------------------------- #
# Placement: engine pods run only on the nodes that staged the revision
# --------------------------------------------------------------------------------------------- #


def check_staged_nodes(nodes, pods, field="staged_nodes", what="the engine", hint="lower replicas"):
    """``nodes`` (node names, ``metadata.name``) as a sorted list; SpecError when it cannot hold ``pods`` pods.

    Each engine pod holds a whole GPU node (and a required anti-affinity-free node choice): ``pods`` pods need
    ``pods`` distinct nodes that hold the revision, else one of them is scheduled where the hostPath is missing.
    """
    if nodes is None:
        return None
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise SpecError("%s: must be a list of node names (the names `kubectl get nodes` shows)" % field)
    # a Node's name is a DNS-1123 subdomain (pkg/apis/core/validation ValidateNodeName)
    bad = [n for n in nodes if not names.is_dns1123_subdomain(n)]
    if bad:
        raise SpecError("%s: %s is not a node name (a DNS-1123 subdomain); set the host's "
                        "k8s_node_name to the name `kubectl get nodes` shows" % (field, ", ".join(repr(b) for b in bad)))
    unique = sorted(set(nodes))
    if len(unique) < pods:
        raise SpecError(
            "%s: the revision is staged on %d node(s) (%s) but %s needs %d pod(s), one node each; stage it on "
            "more nodes or %s" % (field, len(unique), ", ".join(unique) or "none", what, pods, hint))
    return unique


# --------------------------------------------------------------------------------------------- #
# RDMA: one definition for multi-node engines and the P/D roles
# --------------------------------------------------------------------------------------------- #


def check_rdma(rdma, field="rdma"):
    """The RDMA knobs, normalised; ``None`` when off (``{}``/unset).

    ``resource``/``count``: the RDMA device plugin's extended resource (``rdma/rdma_shared_device_a``: the
    /dev/infiniband devices in the pod); ``networks``: the Multus secondary networks of the RDMA NICs;
    ``host_network``: the node's own interfaces instead; ``nccl_ib_hca``: NCCL_IB_HCA; ``socket_ifname``:
    NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (the interface the ranks bootstrap over). IPC_LOCK is always added:
    verbs memory registration needs RLIMIT_MEMLOCK lifted (else ``ibv_create_cq() failed: Cannot allocate memory``).
    """
    if not rdma:
        return None
    if not isinstance(rdma, dict):
        raise SpecError("%s: must be a mapping with %s" % (field, ", ".join(sorted(RDMA_KEYS))))
    unknown = sorted(set(rdma) - RDMA_KEYS)
    if unknown:
        raise SpecError("%s: unknown key(s) %s; allowed: %s" % (field, ", ".join(unknown), ", ".join(sorted(RDMA_KEYS))))
    r = dict(resource="", count=1, networks="", host_network=False, nccl_ib_hca="", socket_ifname="")
    r.update({k: v for k, v in rdma.items() if v is not None})
    if r["resource"] and not (isinstance(r["resource"], str) and re.match(r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+$", r["resource"])):
        raise SpecError("%s.resource: %r is not an extended resource name such as rdma/rdma_shared_device_a"
                        % (field, r["resource"]))
    if not isinstance(r["count"], int) or isinstance(r["count"], bool) or r["count"] < 1:
        raise SpecError("%s.count: must be an integer >= 1, got %r" % (field, r["count"]))
    for key in ("networks", "nccl_ib_hca", "socket_ifname"):
        if not isinstance(r[key], str) or any(c.isspace() for c in r[key]):
            raise SpecError("%s.%s: must be a string without spaces (a comma list), got %r" % (field, key, r[key]))
    if not isinstance(r["host_network"], bool):
        raise SpecError("%s.host_network: must be true or false" % field)
    if r["host_network"] and r["networks"]:
        raise SpecError("%s: networks (Multus) and host_network exclude each other: a hostNetwork pod gets no "
                        "Multus interfaces; keep one" % field)
    return r


def rdma_env(r):
    """The NCCL/Gloo interface variables of the knobs (none when unset)."""
    env = []
    if r and r["nccl_ib_hca"]:
        env.append({"name": "NCCL_IB_HCA", "value": r["nccl_ib_hca"]})
    if r and r["socket_ifname"]:
        env += [{"name": "NCCL_SOCKET_IFNAME", "value": r["socket_ifname"]},
                {"name": "GLOO_SOCKET_IFNAME", "value": r["socket_ifname"]}]
    return env


# --------------------------------------------------------------------------------------------- #
# Every input of the engine's objects
# --------------------------------------------------------------------------------------------- #


def validate(p):
    """Check the engine inputs ``p`` (:data:`_k8s_engine.DEFAULTS` filled in); normalises ``env``, ``rdma`` and
    ``staged_nodes`` in place."""
    # Credentials first: no later message can then quote one.
    check_credentials(p)
    if p["engine"] not in ("vllm", "sglang"):
        raise SpecError("engine: %r is not vllm or sglang" % (p["engine"],))
    profile_entry(p["profiles"], p["profile"], p["engine"])
    if p["model_source"] not in LOADER_THREADS:
        raise SpecError("model_source: %r is not staged_nvme or shared_fs" % (p["model_source"],))
    for field in ("served_model_name", "namespace", "model_path", "image"):
        if not p.get(field):
            raise SpecError("%s: required" % field)
    problems = names.check_model_name(p["served_model_name"])
    if problems:
        raise SpecError("; ".join(problems))
    for field in ("namespace", "gateway_namespace"):
        if not names.is_dns1123_label(p[field]):
            raise SpecError("%s: %r is not a valid namespace name (DNS-1123 label)" % (field, p[field]))
    if not names.is_dns1123_subdomain(p["gateway_name"]):
        raise SpecError("gateway_name: %r is not a valid Gateway name" % (p["gateway_name"],))
    if p["service_name"] and not names.is_dns1035_label(p["service_name"]):
        raise SpecError(
            "service_name: %r is not a DNS-1035 label (lowercase letters, digits and '-', starting with a "
            "letter, at most 63 characters); leave it unset to derive one from the model name" % (p["service_name"],)
        )
    for field in ("model_path", "kernel_cache_dir"):
        if p[field] and not os.path.isabs(p[field]):
            raise SpecError("%s: %r must be an absolute path (it is the node path and the container path)" % (field, p[field]))
    if p["model_pvc"] and p["model_source"] != "shared_fs":
        raise SpecError("model_pvc: only used with model_source=shared_fs (staged revisions are read from the node's NVMe)")
    for field, low in (("tp_size", 1), ("pp_size", 1), ("nodes", 1), ("replicas", 0), ("port", 1),
                       ("startup_timeout", 60), ("probe_period", 1)):
        if not isinstance(p[field], int) or isinstance(p[field], bool) or p[field] < low:
            raise SpecError("%s: must be an integer >= %d, got %r" % (field, low, p[field]))
    if p["port"] > 65535:
        raise SpecError("port: %r is not a TCP port" % p["port"])
    if (p["tp_size"] * p["pp_size"]) % p["nodes"]:
        raise SpecError("nodes: tp_size x pp_size = %d GPUs cannot be split evenly over %d nodes; each node holds "
                        "the same number of GPUs (for two 8-GPU nodes: tp_size 8, pp_size 2, nodes 2)"
                        % (p["tp_size"] * p["pp_size"], p["nodes"]))
    if p["dist_port"] is not None and (not isinstance(p["dist_port"], int) or not 1 <= p["dist_port"] <= 65535
                                       or p["dist_port"] == p["port"]):
        raise SpecError("dist_port: %r must be a TCP port other than port (%d)" % (p["dist_port"], p["port"]))
    if p["loader_threads"] is not None and (not isinstance(p["loader_threads"], int) or p["loader_threads"] < 1):
        raise SpecError("loader_threads: must be an integer >= 1")
    check_shm_size(p["shm_size"])
    check_quantity("cpu_request", p["cpu_request"], cpu=True)
    check_quantity("memory_request", p["memory_request"])
    check_hf_token_secret(p["hf_token_secret"])
    check_image_pull_secret(p["image_pull_secret"])
    if p["priority_class_name"] and not names.is_dns1123_subdomain(p["priority_class_name"]):
        raise SpecError("priority_class_name: %r is not a PriorityClass name" % (p["priority_class_name"],))
    gpu_in_resources = [k for part in ("requests", "limits") for k in (p["resources"] or {}).get(part, {}) if k == p["gpu_resource"]]
    if gpu_in_resources:
        raise SpecError("resources: do not set %s there; the engine requests exactly tp_size GPUs (tp_size x pp_size / nodes per pod)"
                        % p["gpu_resource"])
    for key in (p["labels"] or {}):
        if key.startswith("model.aibrix.ai/") or key.startswith("app.kubernetes.io/"):
            raise SpecError("labels: %r is set by the collection and cannot be overridden" % key)
    if p["init"]:
        init_flavour(p["init"])
    p["rdma"] = check_rdma(p["rdma"])
    if p["rdma"]:
        taken = sorted({e["name"] for e in rdma_env(p["rdma"])} & {e.get("name") for e in p["env"] or []})
        if taken:
            raise SpecError("env: %s is set by rdma (nccl_ib_hca, socket_ifname); set it in one place" % ", ".join(taken))
        given = [k for part in ("requests", "limits") for k in (p["resources"] or {}).get(part, {})]
        if p["rdma"]["resource"] and p["rdma"]["resource"] in given:
            raise SpecError("resources: do not set %s there; rdma.resource and rdma.count set it" % p["rdma"]["resource"])
    if p["model_source"] == "staged_nvme":
        p["staged_nodes"] = check_staged_nodes(
            p["staged_nodes"], p["replicas"] * p["nodes"],
            what="replicas %d x nodes %d" % (p["replicas"], p["nodes"]) if p["nodes"] > 1 else "replicas %d" % p["replicas"],
            hint="lower replicas")
    elif p["staged_nodes"] is not None:
        p["staged_nodes"] = check_staged_nodes(p["staged_nodes"], 0)
    check_tolerations(p["tolerations"] or [])
    check_command(p["command"])
    check_args(p["engine"], p["engine_args"] or {}, p["extra_args"] or [])
