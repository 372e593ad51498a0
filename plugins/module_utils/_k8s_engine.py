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

from ansible_collections.llmops.serving.plugins.module_utils import _aibrix_route as route
from ansible_collections.llmops.serving.plugins.module_utils import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils import _process
from ansible_collections.llmops.serving.plugins.module_utils import _secrets

AIBRIX_NAME = route.AIBRIX_NAME
AIBRIX_PORT = route.AIBRIX_PORT
AIBRIX_ENGINE = route.AIBRIX_ENGINE
MANAGED_BY = "llmops.serving"

# Paths the AIBrix model-router controller matches (the one list lives in _aibrix_route).
AIBRIX_ROUTE_PATHS = list(route.ROUTE_PATHS)

# The field report's GLM-5.2 FP8 command lines (TP=8 on 8 x H20 141 GB). ``True`` is a bare flag.
PROFILES = {
    "glm-5.2-fp8": {
        "vllm": [
            ("kv-cache-dtype", "fp8"),
            ("gpu-memory-utilization", 0.90),
            ("max-model-len", 131072),
            ("max-num-seqs", 16),
            ("max-num-batched-tokens", 32768),
            ("tool-call-parser", "glm47"),
            ("reasoning-parser", "glm45"),
            ("enable-auto-tool-choice", True),
            ("enable-prefix-caching", True),
        ],
        "sglang": [
            ("kv-cache-dtype", "fp8_e4m3"),
            ("reasoning-parser", "glm45"),
            ("tool-call-parser", "glm47"),
            ("context-length", 131072),
            ("mem-fraction-static", 0.85),
            ("speculative-algorithm", "EAGLE"),
            ("speculative-num-steps", 3),
            ("speculative-eagle-topk", 1),
            ("speculative-num-draft-tokens", 4),
            ("max-running-requests", 32),
            ("enable-metrics", True),
            ("enable-metrics-for-all-schedulers", True),
            ("enable-cache-report", True),
        ],
    },
    "none": {"vllm": [], "sglang": []},
}

DEFAULT_COMMAND = {
    "vllm": ["vllm", "serve"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
}

# Flags the collection sets itself: the served name must be byte-identical to the AIBrix label and the
# port to the probes and the Service, so they cannot be overridden through engine_args/extra_args.
MANAGED_FLAGS = {
    "vllm": {"model", "host", "port", "tensor-parallel-size", "tp", "served-model-name"},
    "sglang": {"model-path", "model", "host", "port", "tp-size", "tp", "served-model-name"},
}

# Default loader threads per TP rank, by where the weights are read from.
LOADER_THREADS = {"staged_nvme": 8, "shared_fs": 2}

QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}

DEFAULTS = dict(
    engine="vllm",
    served_model_name=None,
    namespace=None,
    gateway_namespace="aibrix-system",
    gateway_name="aibrix-eg",
    model_path=None,
    model_source="staged_nvme",
    model_pvc=None,
    model_pvc_sub_path=None,
    tp_size=8,
    replicas=1,
    image=None,
    image_pull_policy="IfNotPresent",
    image_pull_secret=None,
    port=8000,
    profile="glm-5.2-fp8",
    engine_args={},
    extra_args=[],
    command=None,
    gpu_resource="nvidia.com/gpu",
    resources={},
    node_selector={},
    affinity={},
    tolerations=[],
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
    route_request_timeout="120s",
    labels={},
    annotations={},
)


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

    The rule is engine_process's (``_process.command_problems``), applied without reading files of this host:
    ``start 2>&1 | tee log`` returns tee's 0 after the engine crashed, and Kubernetes then shows a crashed
    engine as Completed.
    """
    if not command:
        return
    if not isinstance(command, list) or not all(isinstance(c, str) and c for c in command):
        raise SpecError("command: must be a non-empty list of strings (exec form)")
    reasons = _process.command_problems(list(command), read_files=False)
    if reasons:
        raise SpecError(
            "command: the %s command wraps the engine in a way that masks its exit status (%s). A crashed engine "
            "would show as Completed/exit 0; run the engine directly (exec form) or 'exec' it as the last "
            "step of the script." % (os.path.basename(command[0]), "; ".join(reasons))
        )


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
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise SpecError("engine_args: model-loader-extra-config must be a JSON object, got %r" % (raw,))
    if not isinstance(value, dict):
        raise SpecError("engine_args: model-loader-extra-config must be a JSON object, got %r" % (raw,))
    return value


def engine_argv(p):
    """Return ``(command, args, final_flags)`` for the container."""
    engine = p["engine"]
    pairs = list(PROFILES[p["profile"]][engine])
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
    else:
        head = ["--model-path", p["model_path"], "--host", "0.0.0.0", "--port", str(p["port"]),
                "--tp-size", str(p["tp_size"]), "--served-model-name", p["served_model_name"]]
    args = head + args_to_argv([(k, final[k]) for k in order]) + list(p["extra_args"] or [])
    command = list(p["command"] or DEFAULT_COMMAND[engine])
    return command, args, final


# --------------------------------------------------------------------------------------------- #
# Objects
# --------------------------------------------------------------------------------------------- #


def probes(startup_timeout, period):
    """startupProbe covering ``startup_timeout``; readiness/liveness only start after it succeeded."""
    http = {"path": "/health", "port": "http"}
    startup = dict(httpGet=dict(http), periodSeconds=period, timeoutSeconds=5, successThreshold=1,
                   failureThreshold=int(math.ceil(float(startup_timeout) / period)))
    readiness = dict(httpGet=dict(http), periodSeconds=10, timeoutSeconds=5, successThreshold=1, failureThreshold=3)
    liveness = dict(httpGet=dict(http), periodSeconds=30, timeoutSeconds=10, successThreshold=1, failureThreshold=5)
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
    seen = {e["name"] for e in env}
    for item in p["env"] or []:
        if item["name"] in seen:
            env = [e for e in env if e["name"] != item["name"]]
        env.append(dict(item))
    return env


def _validate(p):
    # Credentials first: no later message can then quote one.
    check_credentials(p)
    if p["engine"] not in ("vllm", "sglang"):
        raise SpecError("engine: %r is not vllm or sglang" % (p["engine"],))
    if p["profile"] not in PROFILES:
        raise SpecError("profile: %r is not one of %s" % (p["profile"], ", ".join(sorted(PROFILES))))
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
    for field, low in (("tp_size", 1), ("replicas", 0), ("port", 1), ("startup_timeout", 60), ("probe_period", 1)):
        if not isinstance(p[field], int) or p[field] < low:
            raise SpecError("%s: must be an integer >= %d, got %r" % (field, low, p[field]))
    if p["port"] > 65535:
        raise SpecError("port: %r is not a TCP port" % p["port"])
    if p["loader_threads"] is not None and (not isinstance(p["loader_threads"], int) or p["loader_threads"] < 1):
        raise SpecError("loader_threads: must be an integer >= 1")
    if p["shm_size"] and not QUANTITY.match(str(p["shm_size"])):
        raise SpecError("shm_size: %r is not a Kubernetes quantity such as 64Gi" % (p["shm_size"],))
    if p["hf_token_secret"] and not (isinstance(p["hf_token_secret"], dict) and p["hf_token_secret"].get("name")):
        raise SpecError("hf_token_secret: must be {name: <Secret>, key: <key>} naming an existing Secret")
    if p["image_pull_secret"] and not names.is_dns1123_subdomain(p["image_pull_secret"]):
        raise SpecError("image_pull_secret: %r is not a Secret name" % (p["image_pull_secret"],))
    gpu_in_resources = [k for part in ("requests", "limits") for k in (p["resources"] or {}).get(part, {}) if k == p["gpu_resource"]]
    if gpu_in_resources:
        raise SpecError("resources: do not set %s there; the engine requests exactly tp_size GPUs" % p["gpu_resource"])
    for key in (p["labels"] or {}):
        if key.startswith("model.aibrix.ai/") or key.startswith("app.kubernetes.io/"):
            raise SpecError("labels: %r is set by the collection and cannot be overridden" % key)
    check_tolerations(p["tolerations"] or [])
    check_command(p["command"])
    check_args(p["engine"], p["engine_args"] or {}, p["extra_args"] or [])


def build(params):
    """Validate ``params`` (keys of :data:`DEFAULTS`) and return the objects and derived facts."""
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None or k in ("loader_threads",)})
    _validate(p)
    model = p["served_model_name"]
    svc = p["service_name"] or names.service_name(model)
    command, args, final = engine_argv(p)
    concurrency = read_concurrency(p["engine"], p["model_source"], p["replicas"], p["tp_size"], final)
    warnings = []
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

    selector = {"app.kubernetes.io/name": svc, "app.kubernetes.io/instance": svc}
    common = dict(selector, **{"app.kubernetes.io/component": "engine", "app.kubernetes.io/managed-by": MANAGED_BY})
    aibrix = route.pod_labels(model, p["port"], p["engine"])
    pod_labels = dict(common, **aibrix)
    pod_labels.update(p["labels"] or {})
    # With the route managed here the Deployment itself carries no model.aibrix.ai/name: the AIBrix
    # controller would otherwise create its own <model>-router pointing at a Service named exactly the
    # model (impossible for names with dots). The gateway and /v1/models discover the pods' labels.
    deploy_labels = dict(common) if p["manage_route"] else dict(common, **aibrix)

    startup, readiness, liveness = probes(p["startup_timeout"], p["probe_period"])
    volumes, mounts = _volumes(p)
    gpu = {p["gpu_resource"]: str(p["tp_size"])}
    resources = {"requests": dict((p["resources"] or {}).get("requests", {}), **gpu),
                 "limits": dict((p["resources"] or {}).get("limits", {}), **gpu)}
    container = {
        "name": "engine",
        "image": p["image"],
        "imagePullPolicy": p["image_pull_policy"],
        "command": command,
        "args": args,
        "ports": [{"name": "http", "containerPort": p["port"], "protocol": "TCP"}],
        "env": _env(p),
        "resources": resources,
        "volumeMounts": mounts,
        "startupProbe": startup,
        "readinessProbe": readiness,
        "livenessProbe": liveness,
    }
    if not container["env"]:
        del container["env"]
    pod_spec = {
        "containers": [container],
        "volumes": volumes,
        # Service links inject <SVC>_PORT=tcp://... variables; a Service named "vllm" would shadow
        # vLLM's own VLLM_PORT setting.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 120,
    }
    if p["node_selector"]:
        pod_spec["nodeSelector"] = dict(p["node_selector"])
    if p["affinity"]:
        pod_spec["affinity"] = p["affinity"]
    if p["tolerations"]:
        pod_spec["tolerations"] = [dict(t) for t in p["tolerations"]]
    if p["image_pull_secret"]:
        pod_spec["imagePullSecrets"] = [{"name": p["image_pull_secret"]}]
    template_meta = {"labels": pod_labels}
    if p["annotations"]:
        template_meta["annotations"] = dict(p["annotations"])
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": svc, "namespace": p["namespace"], "labels": deploy_labels,
                     "annotations": {"llmops.serving/served-model-name": model}},
        "spec": {
            "replicas": p["replicas"],
            # A TP=8 pod holds a whole 8-GPU node; a surge pod could never schedule beside it.
            "strategy": {"type": "Recreate"},
            # Longer than the startup window plus image pull, so a slow cold start is not "failed".
            "progressDeadlineSeconds": p["startup_timeout"] + 1800,
            "selector": {"matchLabels": selector},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": p["namespace"], "labels": dict(common),
                     "annotations": {"llmops.serving/served-model-name": model}},
        "spec": {"type": "ClusterIP", "selector": selector,
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
    objects.append(deployment)
    net = _secrets.Scan(env_field="env")
    net.objects(objects)
    net.refuse(SpecError)
    startup_window = startup["periodSeconds"] * startup["failureThreshold"]
    return dict(
        objects=objects,
        service_name=svc,
        deployment_name=svc,
        route_name=routed["route_name"],
        reference_grant_name=routed["reference_grant_name"],
        namespace=p["namespace"],
        gateway_namespace=p["gateway_namespace"],
        pod_selector=selector,
        command=command + args,
        read_concurrency=concurrency,
        probe_windows=dict(startup_seconds=startup_window,
                           readiness_seconds=readiness["periodSeconds"] * readiness["failureThreshold"],
                           liveness_seconds=liveness["periodSeconds"] * liveness["failureThreshold"]),
        warnings=warnings,
    )
