# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the Kubernetes objects that serve one model with vLLM or SGLang behind AIBrix.

:func:`build` turns the engine inputs into a Deployment, a Service with a DNS-1035 name, the AIBrix
HTTPRoute ``<model>-router`` in the gateway namespace pointing at that Service and, when the engine
runs in another namespace, a ReferenceGrant for exactly that Service. Everything is validated first;
a bad input raises :class:`SpecError` naming the field and the fix. Credentials are refused wherever they
could be rendered (env, kernel_cache_env, engine_args, extra_args, command, then the built objects) by the
one rule in :mod:`_secrets`; :mod:`_render_dir` writes the objects to a directory for GitOps users.
"""
from __future__ import annotations

import json
import math
import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route as route
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_command
from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, loads_json

AIBRIX_NAME = route.AIBRIX_NAME
AIBRIX_PORT = route.AIBRIX_PORT
AIBRIX_ENGINE = route.AIBRIX_ENGINE
MANAGED_BY = "llmops.serving"

# Paths the AIBrix model-router controller matches (the one list lives in _aibrix_route).
AIBRIX_ROUTE_PATHS = list(route.ROUTE_PATHS)

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

DEFAULT_COMMAND = {
    "vllm": ["vllm", "serve"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
}

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

# CPU and memory requested per GPU when not given: 32 CPUs and 256 GiB for an 8-GPU engine. Requests make the
# pod Burstable instead of BestEffort (GPUs alone do not count for the QoS class, so without them the engine
# is the first pod the kubelet evicts under node memory pressure); no CPU/memory limit is set by default, a
# limit below weights-in-page-cache plus /dev/shm would OOM-kill the loader.
CPU_PER_GPU = 4
MEMORY_GI_PER_GPU = 32

# Init processes that forward signals, reap children and exit with the engine's status (128 + signal when it
# was killed): tini (krallin/tini src/tini.c reap_zombies) and dumb-init (Yelp/dumb-init README).
INIT_ARGS = {"tini": ["-g", "--"], "dumb-init": ["--"]}

# Multi-node rendezvous: vLLM's multiprocessing launcher (--nnodes/--node-rank/--master-addr, --headless on
# the other nodes; vllm-project/vllm PR #23691, docs/serving/parallelism_scaling.md) and SGLang's
# (--nnodes/--node-rank/--dist-init-addr; sgl-project/sglang docs/references/multi_node_deployment).
VLLM_MULTINODE_MIN = "0.11.0"
DIST_PORT = {"vllm": 29501, "sglang": 20000}
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"

# The SGLang project publishes its images as lmsysorg/sglang; Docker Hub's lmsys/sglang is another account.
SGLANG_IMAGE = "lmsysorg/sglang"
DOCKER_HUB = {None, "docker.io", "index.docker.io", "registry-1.docker.io"}

QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
SPREAD_KEYS = {"maxSkew", "topologyKey", "whenUnsatisfiable", "labelSelector", "minDomains", "nodeAffinityPolicy",
               "nodeTaintsPolicy", "matchLabelKeys"}

DEFAULTS = dict(
    engine="vllm",
    served_model_name=None,
    namespace=None,
    gateway_namespace=route.DEFAULT_GATEWAY_NAMESPACE,
    gateway_name=route.DEFAULT_GATEWAY_NAME,
    model_path=None,
    model_source="staged_nvme",
    model_pvc=None,
    model_pvc_sub_path=None,
    tp_size=8,
    pp_size=1,
    nodes=1,
    dist_port=None,
    replicas=1,
    image=None,
    image_pull_policy="IfNotPresent",
    image_pull_secret=None,
    port=8000,
    profile="none",
    profiles={},
    engine_args={},
    extra_args=[],
    command=None,
    init=None,
    gpu_resource="nvidia.com/gpu",
    resources={},
    cpu_request=None,
    memory_request=None,
    node_selector={},
    affinity={},
    tolerations=[],
    priority_class_name=None,
    topology_spread=[],
    startup_timeout=3600,
    probe_period=10,
    kernel_cache_dir=None,
    kernel_cache_env={},
    env=[],
    hf_token_secret=None,
    shm_size="64Gi",
    loader_threads=None,
    read_streams_warn=16,
    service_name=None,
    manage_route=True,
    route_paths=list(AIBRIX_ROUTE_PATHS),
    route_request_timeout=route.DEFAULT_REQUEST_TIMEOUT,
    labels={},
    annotations={},
    staged_nodes=None,
    rdma={},
)


def pod_argument_spec():
    """The spec of the engine options both renderers of engine pods take alike (doc fragment
    ``llmops.serving.engine_pod``), defaults from :data:`DEFAULTS`, to ``update()`` a module's argument spec with."""
    return {
        "engine": {"type": "str", "choices": ["vllm", "sglang"], "default": DEFAULTS["engine"]},
        "gpu_resource": {"type": "str", "default": DEFAULTS["gpu_resource"]},
        "probe_period": {"type": "int", "default": DEFAULTS["probe_period"]},
    }


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


def _flag_name(token):
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
        name = _flag_name(tok)
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
# Engine command line
# --------------------------------------------------------------------------------------------- #


def _fmt(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def args_to_argv(pairs):
    """``[(flag, value)]`` -> argv. ``True`` = bare flag; ``False``/``None`` = flag left out."""
    argv = []
    for flag, value in pairs:
        if value is None or value is False:
            continue
        opt = flag if flag.startswith("-") else "--" + flag
        argv.append(opt)
        if value is not True:
            argv.append(_fmt(value))
    return argv


def loader_args(engine, model_source, threads):
    """Loader settings chosen from where the weights are read.

    * vLLM on staged NVMe: ``lazy`` (mmap; local reads are cheap, no prefetch pass).
    * vLLM on a shared FS: ``prefetch`` with an explicit thread count (ranks split the shards).
    * SGLang: ``enable_multithread_load`` and ``num_threads`` always both set; when the prefetch path
      finds neither it silently falls back to single-threaded loading.
    """
    if engine == "vllm":
        if model_source == "staged_nvme":
            return [("safetensors-load-strategy", "lazy")]
        return [("safetensors-load-strategy", "prefetch"), ("safetensors-prefetch-num-threads", threads)]
    return [("model-loader-extra-config", {"enable_multithread_load": threads > 1, "num_threads": threads})]


def read_concurrency(engine, model_source, replicas, tp_size, final):
    """Expected concurrent reads of the weights: pods x TP ranks x loader threads per rank."""
    if engine == "vllm":
        strategy = final.get("safetensors-load-strategy")
        if strategy == "prefetch":
            threads = int(final.get("safetensors-prefetch-num-threads") or 8)
        else:
            threads = 1
    else:
        raw = final.get("model-loader-extra-config")
        cfg = raw if isinstance(raw, dict) else _json_or_error(raw)
        missing = [k for k in ("enable_multithread_load", "num_threads") if k not in cfg]
        if missing:
            raise SpecError(
                "engine_args: model-loader-extra-config must set both enable_multithread_load and "
                "num_threads (missing: %s); with either missing SGLang's prefetch path silently loads "
                "single-threaded" % ", ".join(missing)
            )
        threads = int(cfg["num_threads"]) if cfg["enable_multithread_load"] else 1
    total = replicas * tp_size * threads
    return dict(
        model_source=model_source,
        pods=replicas,
        tp_ranks=tp_size,
        threads_per_rank=threads,
        concurrent_reads=total,
        summary="%d pod(s) x %d TP ranks x %d loader thread(s) = %d concurrent reads from %s"
        % (replicas, tp_size, threads, total, "node-local NVMe" if model_source == "staged_nvme" else "the shared filesystem"),
    )


def _json_or_error(raw):
    try:
        value = loads_json(raw if isinstance(raw, (str, bytes)) else "", "engine_args: model-loader-extra-config")
    except UntrustedInput as e:
        raise SpecError("%s; give it as a JSON object such as {\"enable_multithread_load\": true, \"num_threads\": 8}" % e)
    if not isinstance(value, dict):
        raise SpecError("engine_args: model-loader-extra-config must be a JSON object such as "
                        "{\"enable_multithread_load\": true, \"num_threads\": 8}")
    return value


def engine_argv(p, role="leader"):
    """Return ``(command, args, final_flags)`` for the engine container of ``role`` (leader or worker).

    ``command`` is the engine's entrypoint; the init (``p["init"]``), when one is used, is put in front by
    :func:`container_command`. Multi-node pods (``nodes`` > 1) get the engine's rendezvous flags: the node's
    rank is ``$(LWS_WORKER_INDEX)`` (0 on the leader) and the leader's address ``$(LWS_LEADER_ADDRESS)``, both
    expanded by the kubelet from the container's environment.
    """
    engine = p["engine"]
    pairs, _min = profile_entry(p["profiles"], p["profile"], engine)
    threads = p["loader_threads"] or LOADER_THREADS[p["model_source"]]
    pairs += loader_args(engine, p["model_source"], threads)
    final = dict((k.lstrip("-"), v) for k, v in pairs)
    order = [pair[0].lstrip("-") for pair in pairs]
    for flag, value in (p["engine_args"] or {}).items():
        key = flag.lstrip("-")
        if key not in final:
            order.append(key)
        final[key] = value
    if engine == "vllm":
        head = [p["model_path"], "--host", "0.0.0.0", "--port", str(p["port"]),
                "--tensor-parallel-size", str(p["tp_size"]), "--served-model-name", p["served_model_name"]]
        if p["pp_size"] > 1:
            head += ["--pipeline-parallel-size", str(p["pp_size"])]
        if p["nodes"] > 1:
            rank = "0" if role == "leader" else "$(LWS_WORKER_INDEX)"
            head += ["--nnodes", str(p["nodes"]), "--node-rank", rank, "--master-addr", "$(LWS_LEADER_ADDRESS)",
                     "--master-port", str(p["dist_port"])]
            if role == "worker":
                head.append("--headless")
    else:
        head = ["--model-path", p["model_path"], "--host", "0.0.0.0", "--port", str(p["port"]),
                "--tp-size", str(p["tp_size"]), "--served-model-name", p["served_model_name"]]
        if p["pp_size"] > 1:
            head += ["--pp-size", str(p["pp_size"])]
        if p["nodes"] > 1:
            rank = "0" if role == "leader" else "$(LWS_WORKER_INDEX)"
            head += ["--nnodes", str(p["nodes"]), "--node-rank", rank,
                     "--dist-init-addr", "$(LWS_LEADER_ADDRESS):%d" % p["dist_port"]]
    args = head + args_to_argv([(k, final[k]) for k in order]) + list(p["extra_args"] or [])
    command = list(p["command"] or DEFAULT_COMMAND[engine])
    return command, args, final


def container_command(p, command):
    """The container's entrypoint: the engine itself, or ``init -- engine`` when ``init`` names tini/dumb-init."""
    if not p["init"]:
        return list(command)
    return [p["init"]] + INIT_ARGS[init_flavour(p["init"])] + list(command)


# --------------------------------------------------------------------------------------------- #
# Placement: engine pods run only on the nodes that staged the revision
# --------------------------------------------------------------------------------------------- #

# The node label the kubelet sets to the node's name (k8s.io/api/core/v1 well_known_labels.go LabelHostname).
HOSTNAME_LABEL = "kubernetes.io/hostname"


def check_staged_nodes(nodes, pods, field="staged_nodes", what="the engine", hint="lower replicas"):
    """``nodes`` (kubernetes.io/hostname values) as a sorted list; SpecError when it cannot hold ``pods`` pods.

    Each engine pod holds a whole GPU node (and a required anti-affinity-free node choice): ``pods`` pods need
    ``pods`` distinct nodes that hold the revision, else one of them is scheduled where the hostPath is missing.
    """
    if nodes is None:
        return None
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise SpecError("%s: must be a list of node names (kubernetes.io/hostname values)" % field)
    bad = [n for n in nodes if not names.is_label_value(n)]
    if bad:
        raise SpecError("%s: %s is not a node name (a kubernetes.io/hostname label value); set the host's "
                        "k8s_node_name to the name `kubectl get nodes` shows" % (field, ", ".join(repr(b) for b in bad)))
    unique = sorted(set(nodes))
    if len(unique) < pods:
        raise SpecError(
            "%s: the revision is staged on %d node(s) (%s) but %s needs %d pod(s), one node each; stage it on "
            "more nodes or %s" % (field, len(unique), ", ".join(unique) or "none", what, pods, hint))
    return unique


def pin_to_nodes(affinity, nodes):
    """``affinity`` with a required node affinity to exactly ``nodes`` (ANDed with what it already requires).

    The scheduler ORs ``nodeSelectorTerms`` and ANDs the expressions inside one term
    (k8s.io/component-helpers scheduling/corev1/nodeaffinity/nodeaffinity.go), so the hostname expression is
    added to every existing term: no term can then admit a node outside ``nodes``.
    """
    out = json.loads(json.dumps(affinity or {}))
    if nodes is None:
        return out
    expr = {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}
    node_aff = out.setdefault("nodeAffinity", {})
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = [t for t in required.get("nodeSelectorTerms") or [] if t.get("matchExpressions") or t.get("matchFields")]
    if not terms:
        terms = [{}]
    for term in terms:
        term["matchExpressions"] = list(term.get("matchExpressions") or []) + [dict(expr, values=list(nodes))]
    required["nodeSelectorTerms"] = terms
    return out


# --------------------------------------------------------------------------------------------- #
# RDMA: one definition for multi-node engines and the P/D roles
# --------------------------------------------------------------------------------------------- #

MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
RDMA_KEYS = {"resource", "count", "networks", "host_network", "nccl_ib_hca", "socket_ifname"}
# Environment the RDMA knobs set; env entries cannot also set them.
RDMA_ENV = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


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


def apply_rdma(spec, annotations, r):
    """Put the RDMA knobs ``r`` (:func:`check_rdma`) on an engine pod ``spec`` and its ``annotations`` (in place).

    Used by the engine's Deployment and every LeaderWorkerSet pod and by the P/D roles, so both get the same
    device resource, capability, network attachment and NCCL/Gloo interfaces.
    """
    if not r:
        return
    container = spec["containers"][0]
    if r["resource"]:
        for part in ("requests", "limits"):
            container.setdefault("resources", {}).setdefault(part, {})[r["resource"]] = str(r["count"])
    caps = container.setdefault("securityContext", {}).setdefault("capabilities", {}).setdefault("add", [])
    if "IPC_LOCK" not in caps:
        caps.append("IPC_LOCK")
    env = rdma_env(r)
    if env:
        taken = {e["name"] for e in env}
        container["env"] = env + [e for e in container.get("env") or [] if e["name"] not in taken]
    if r["host_network"]:
        # The engines then use the node's interfaces (RDMA netdevs included); cluster DNS still resolves.
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if r["networks"]:
        annotations[MULTUS_NETWORKS] = r["networks"]


# --------------------------------------------------------------------------------------------- #
# Objects
# --------------------------------------------------------------------------------------------- #


# Headroom of the startup probe over startup_timeout: the kubelet's window must outlast the wait that reports a
# slow start, so a start that takes just the timeout is reported as slow by the wait, not killed mid-load.
STARTUP_HEADROOM_SECONDS = 300
STARTUP_HEADROOM_FRACTION = 0.10
# SGLang serves /health and /health_generate with one handler (health_generate in
# python/sglang/srt/entrypoints/http_server.py, sgl-project/sglang v0.5.x) that sends a one-token request and waits
# up to SGLANG_HEALTH_CHECK_TIMEOUT seconds (default 20) for the detokenizer before answering 503: a probe timeout
# below that budget fails a server that is only busy, and the liveness probe then kills it.
SGLANG_HEALTH_CHECK_TIMEOUT = 20
PROBE_TIMEOUT = {"vllm": 5, "sglang": SGLANG_HEALTH_CHECK_TIMEOUT + 5}


def startup_window(startup_timeout):
    """Seconds the startup probe allows: ``startup_timeout`` plus max(300 s, 10 %)."""
    return startup_timeout + max(STARTUP_HEADROOM_SECONDS, int(math.ceil(startup_timeout * STARTUP_HEADROOM_FRACTION)))


def progress_deadline(startup_timeout):
    """``progressDeadlineSeconds`` of an engine Deployment: the startup window plus 30 min of image pull, so a slow
    cold start is not ProgressDeadlineExceeded (the default 600 s is far below a 700 GiB load)."""
    return startup_window(startup_timeout) + 1800


def probes(startup_timeout, period, engine="vllm"):
    """startupProbe covering ``startup_timeout`` with headroom; readiness/liveness only start after it succeeded."""
    http = {"path": "/health", "port": "http"}
    timeout = PROBE_TIMEOUT.get(engine, 5)
    startup = dict(httpGet=dict(http), periodSeconds=period, timeoutSeconds=timeout, successThreshold=1,
                   failureThreshold=int(math.ceil(float(startup_window(startup_timeout)) / period)))
    readiness = dict(httpGet=dict(http), periodSeconds=max(10, timeout + 5), timeoutSeconds=timeout,
                     successThreshold=1, failureThreshold=3)
    liveness = dict(httpGet=dict(http), periodSeconds=30, timeoutSeconds=max(10, timeout), successThreshold=1,
                    failureThreshold=5)
    return startup, readiness, liveness


def _volumes(p):
    volumes, mounts = [], []
    if p["model_source"] == "shared_fs" and p["model_pvc"]:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": p["model_pvc"], "readOnly": True}})
        mount = {"name": "model", "mountPath": p["model_path"], "readOnly": True}
        if p["model_pvc_sub_path"]:
            mount["subPath"] = p["model_pvc_sub_path"]
        mounts.append(mount)
    else:
        # The same path on the node and in the container: the path the stager wrote is the path the
        # engine reads, so the two can never drift apart.
        volumes.append({"name": "model", "hostPath": {"path": p["model_path"], "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": p["model_path"], "readOnly": True})
    if p["kernel_cache_dir"]:
        volumes.append({"name": "kernel-cache", "hostPath": {"path": p["kernel_cache_dir"], "type": "Directory"}})
        mounts.append({"name": "kernel-cache", "mountPath": p["kernel_cache_dir"]})
    shm = {"medium": "Memory"}
    if p["shm_size"]:
        shm["sizeLimit"] = p["shm_size"]
    volumes.append({"name": "dshm", "emptyDir": shm})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _env(p):
    env = [{"name": k, "value": _fmt(v)} for k, v in sorted((p["kernel_cache_env"] or {}).items())]
    if p["hf_token_secret"]:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": p["hf_token_secret"]["name"], "key": p["hf_token_secret"].get("key") or "token"}}})
    if p["nodes"] > 1:
        # The node rank for $(LWS_WORKER_INDEX) in the arguments, from the label LeaderWorkerSet puts on every
        # pod (0 on the leader); the same downward-API reference SGLang's LWS examples use.
        env.append({"name": "LWS_WORKER_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['%s']" % LWS_WORKER_INDEX_LABEL}}})
        if p["engine"] == "vllm":
            # the address this node's workers announce to the others
            env.append({"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    seen = {e["name"] for e in env}
    for item in p["env"] or []:
        if item["name"] in seen:
            env = [e for e in env if e["name"] != item["name"]]
        env.append(dict(item))
    return env


def gpus_per_pod(p):
    return p["tp_size"] * p["pp_size"] // p["nodes"]


def container_resources(p, gpus):
    """GPU count exactly; CPU and memory requested (4 CPUs and 32 GiB per GPU unless given).

    An explicit ``resources.requests`` value wins, then ``cpu_request``/``memory_request``; with only a limit
    set, no request is added (Kubernetes then requests the limit).
    """
    given = p["resources"] or {}
    requests = dict(given.get("requests") or {})
    limits = dict(given.get("limits") or {})
    for key, explicit, default in (("cpu", p["cpu_request"], str(CPU_PER_GPU * gpus)),
                                   ("memory", p["memory_request"], "%dGi" % (MEMORY_GI_PER_GPU * gpus))):
        if key in requests:
            continue
        if explicit:
            requests[key] = str(explicit)
        elif key not in limits:
            requests[key] = default
    gpu = {p["gpu_resource"]: str(gpus)}
    requests.update(gpu)
    limits.update(gpu)
    return {"requests": requests, "limits": limits}


def _validate(p):
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
    if p["shm_size"] and not QUANTITY.match(str(p["shm_size"])):
        raise SpecError("shm_size: %r is not a Kubernetes quantity such as 64Gi" % (p["shm_size"],))
    check_quantity("cpu_request", p["cpu_request"], cpu=True)
    check_quantity("memory_request", p["memory_request"])
    if p["hf_token_secret"] and not (isinstance(p["hf_token_secret"], dict) and p["hf_token_secret"].get("name")):
        raise SpecError("hf_token_secret: must be {name: <Secret>, key: <key>} naming an existing Secret")
    if p["image_pull_secret"] and not names.is_dns1123_subdomain(p["image_pull_secret"]):
        raise SpecError("image_pull_secret: %r is not a Secret name" % (p["image_pull_secret"],))
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


def engine_pod_spec(container, volumes, init=None, host_network=False, node_selector=None, affinity=None,
                    tolerations=None, image_pull_secret=None, priority_class_name=None, spread=None):
    """The pod spec around one engine container: this module's engine pods and the P/D roles of ``_pd_manifests``."""
    spec = {
        "containers": [container],
        "volumes": volumes,
        # Service links inject <SVC>_PORT=tcp://... variables; a Service named "vllm" would shadow
        # vLLM's own VLLM_PORT setting.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 120,
    }
    if not init:
        # Without an init in the image the pause container becomes PID 1, so the engine is not: a process that
        # SIGKILLs itself as PID 1 survives it (the kernel drops signals PID 1 has no handler for), and SGLang's
        # kill_process_tree then reaches sys.exit(0) and the crash shows as Completed.
        spec["shareProcessNamespace"] = True
    if host_network:
        # The engines then use the node's interfaces (RDMA netdevs included); cluster DNS still resolves.
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["affinity"] = affinity
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if image_pull_secret:
        spec["imagePullSecrets"] = [{"name": image_pull_secret}]
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    if spread:
        spec["topologySpreadConstraints"] = [dict(c) for c in spread]
    return spec


def _pod_spec(p, container, volumes, spread):
    return engine_pod_spec(container, volumes, init=p["init"], node_selector=p["node_selector"],
                           affinity=pin_to_nodes(p["affinity"], p["staged_nodes"]) if p["staged_nodes"] else p["affinity"],
                           tolerations=p["tolerations"], image_pull_secret=p["image_pull_secret"],
                           priority_class_name=p["priority_class_name"], spread=spread)


def _container(p, role, volumes_mounts, probes_):
    command, args, _final = engine_argv(p, role)
    container = {
        "name": "engine",
        "image": p["image"],
        "imagePullPolicy": p["image_pull_policy"],
        "command": container_command(p, command),
        "args": args,
        "ports": [{"name": "http", "containerPort": p["port"], "protocol": "TCP"}],
        "env": _env(p),
        "resources": container_resources(p, gpus_per_pod(p)),
        "volumeMounts": volumes_mounts,
    }
    if p["nodes"] > 1:
        container["ports"].append({"name": "dist", "containerPort": p["dist_port"], "protocol": "TCP"})
    if role == "leader":
        container["startupProbe"], container["readinessProbe"], container["livenessProbe"] = probes_
    if not container["env"]:
        del container["env"]
    return container


def build(params):
    """Validate ``params`` (keys of :data:`DEFAULTS`) and return the objects and derived facts."""
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None or k in ("loader_threads",)})
    if p["dist_port"] is None:
        p["dist_port"] = DIST_PORT.get(p["engine"], 29501)
    _validate(p)
    model = p["served_model_name"]
    svc = p["service_name"] or names.service_name(model)
    _pairs, min_version = profile_entry(p["profiles"], p["profile"], p["engine"])
    warnings = check_image(p["engine"], p["image"], min_version, p["profile"], p["nodes"])
    command, args, final = engine_argv(p)
    gpus = gpus_per_pod(p)
    concurrency = read_concurrency(p["engine"], p["model_source"], p["replicas"] * p["nodes"], gpus, final)
    if p["model_source"] == "shared_fs" and concurrency["concurrent_reads"] > p["read_streams_warn"]:
        warnings.append(
            "%s exceeds read_streams_warn=%d; the shared filesystem sees this per rollout. Stage the "
            "revision to node NVMe or lower loader_threads." % (concurrency["summary"], p["read_streams_warn"])
        )
    if p["kernel_cache_dir"]:
        outside = sorted(k for k, v in (p["kernel_cache_env"] or {}).items()
                         if isinstance(v, str) and v.startswith("/") and not (v + "/").startswith(p["kernel_cache_dir"].rstrip("/") + "/"))
        if outside:
            warnings.append("kernel_cache_env: %s point outside kernel_cache_dir %s, so those caches are "
                            "not persisted" % (", ".join(outside), p["kernel_cache_dir"]))
    elif p["kernel_cache_env"]:
        warnings.append("kernel_cache_env is set but kernel_cache_dir is not: the caches land in the "
                        "container filesystem and are lost with the pod")
    if p["model_source"] == "staged_nvme" and p["staged_nodes"] is None and p["replicas"]:
        warnings.append("staged_nodes is not set: the engine pods can be scheduled on any GPU node, and on one that "
                        "never staged %s the hostPath mount fails after scheduling; pass the nodes that staged it "
                        "(the engine role does)" % p["model_path"])
    resources = container_resources(p, gpus)
    mem = quantity_bytes(resources["requests"]["memory"]) if "memory" in resources["requests"] else None
    shm = quantity_bytes(p["shm_size"]) if p["shm_size"] else None
    if mem is not None and shm and mem < shm:
        warnings.append("memory request %s is below shm_size %s: /dev/shm is memory charged to the engine "
                        "container" % (resources["requests"]["memory"], p["shm_size"]))

    multi = p["nodes"] > 1
    selector = {"app.kubernetes.io/name": svc, "app.kubernetes.io/instance": svc}
    common = dict(selector, **{"app.kubernetes.io/component": "engine", "app.kubernetes.io/managed-by": MANAGED_BY})
    aibrix = route.pod_labels(model, p["port"], p["engine"])
    # The leader (the pod that serves HTTP) carries component=engine; multi-node workers engine-worker, so the
    # Service, the AIBrix labels and the rollout wait select the leader only.
    pod_selector = dict(selector, **{"app.kubernetes.io/component": "engine"}) if multi else dict(selector)
    leader_labels = dict(common, **aibrix)
    leader_labels.update(p["labels"] or {})
    worker_labels = dict(common, **{"app.kubernetes.io/component": "engine-worker"})
    worker_labels.update(p["labels"] or {})
    # The workload itself never carries model.aibrix.ai/name when the route is managed here: AIBrix's
    # controller would otherwise create its own <model>-router pointing at a Service named exactly the model
    # (impossible for names with dots). The gateway and /v1/models discover the pods' labels.
    workload_labels = route.workload_labels(common) if p["manage_route"] else dict(common, **aibrix)
    spread = check_topology_spread(p["topology_spread"] or [], selector)

    startup, readiness, liveness = probes(p["startup_timeout"], p["probe_period"], p["engine"])
    volumes, mounts = _volumes(p)
    annotations = {route.SERVED_NAME_ANNOTATION: model}

    def template(role):
        meta = {"labels": leader_labels if role == "leader" else worker_labels}
        if p["annotations"]:
            meta["annotations"] = dict(p["annotations"])
        container = _container(p, role, [dict(m) for m in mounts], (startup, readiness, liveness))
        spec = _pod_spec(p, container, [dict(v) for v in volumes], spread)
        pod_annotations = dict(p["annotations"] or {})
        apply_rdma(spec, pod_annotations, p["rdma"])
        if pod_annotations:
            meta["annotations"] = pod_annotations
        return {"metadata": meta, "spec": spec}

    if multi:
        lws_name = names.statefulset_safe_name(svc)
        workload = {
            "apiVersion": LWS_API,
            "kind": "LeaderWorkerSet",
            "metadata": {"name": lws_name, "namespace": p["namespace"], "labels": workload_labels,
                         "annotations": dict(annotations)},
            "spec": {
                "replicas": p["replicas"],
                # Workers are created with the leader: the leader cannot become Ready before every node joined.
                "startupPolicy": "LeaderCreated",
                # One group (all of its nodes) at a time, never an extra group of GPU nodes.
                "rolloutStrategy": {"type": "RollingUpdate",
                                    "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
                "leaderWorkerTemplate": {
                    "size": p["nodes"],
                    # A restarted rank cannot rejoin a running NCCL group: the whole group starts again.
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": template("leader"),
                    "workerTemplate": template("worker"),
                },
            },
        }
    else:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": svc, "namespace": p["namespace"], "labels": workload_labels,
                         "annotations": dict(annotations)},
            "spec": {
                "replicas": p["replicas"],
                # One GPU node at a time and never a surge pod (a TP=8 pod holds a whole node, a surge pod could
                # not schedule beside it): with one replica the same as Recreate, with more the others keep serving.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                # Longer than the startup window plus image pull, so a slow cold start is not "failed".
                "progressDeadlineSeconds": progress_deadline(p["startup_timeout"]),
                "selector": {"matchLabels": selector},
                "template": template("leader"),
            },
        }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": p["namespace"], "labels": dict(common),
                     "annotations": dict(annotations)},
        "spec": {"type": "ClusterIP", "selector": dict(pod_selector),
                 "ports": [{"name": "http", "port": p["port"], "targetPort": "http", "protocol": "TCP"}]},
    }
    objects = [service]
    routed = dict(route_name=None, reference_grant_name=None)
    if p["manage_route"]:
        try:
            routed = route.route_objects(
                model, svc, p["namespace"], p["port"], gateway_name=p["gateway_name"],
                gateway_namespace=p["gateway_namespace"], request_timeout=p["route_request_timeout"],
                paths=p["route_paths"], labels=common)
        except route.RouteError as e:
            raise SpecError(str(e))
        objects.extend(routed["objects"])
        warnings.extend(routed["warnings"])
    pdb_name = None
    if p["replicas"] > 1:
        # Voluntary disruptions (node drains) take one engine pod at a time; the others keep serving.
        pdb_name = svc
        objects.append({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": svc, "namespace": p["namespace"], "labels": dict(common)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(selector)}},
        })
    objects.append(workload)
    problems = route.workload_problems(objects) if p["manage_route"] else []
    if problems:
        raise SpecError("; ".join(problems))
    net = _secrets.Scan(env_field="env")
    net.objects(objects)
    net.refuse(SpecError)
    startup_seconds = startup["periodSeconds"] * startup["failureThreshold"]
    return dict(
        objects=objects,
        service_name=svc,
        deployment_name=None if multi else svc,
        workload=dict(kind=workload["kind"], name=workload["metadata"]["name"]),
        pod_disruption_budget_name=pdb_name,
        route_name=routed["route_name"],
        reference_grant_name=routed["reference_grant_name"],
        namespace=p["namespace"],
        gateway_namespace=p["gateway_namespace"],
        pod_selector=pod_selector,
        command=container_command(p, command) + args,
        read_concurrency=concurrency,
        staged_nodes=p["staged_nodes"],
        probe_windows=dict(startup_seconds=startup_seconds,
                           readiness_seconds=readiness["periodSeconds"] * readiness["failureThreshold"],
                           liveness_seconds=liveness["periodSeconds"] * liveness["failureThreshold"]),
        warnings=warnings,
    )
