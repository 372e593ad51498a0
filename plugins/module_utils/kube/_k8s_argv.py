# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the engine container's command line, from the engine inputs.

* :func:`engine_argv` - ``(command, args, final flags)`` of the leader or a worker: the flags the collection
  manages (model, port, parallel layout, served name, multi-node rendezvous), then the profile's, the loader's
  and ``engine_args``, then ``extra_args``.
* :func:`container_command` - the entrypoint, behind ``tini``/``dumb-init`` when ``init`` names one.
* :func:`args_to_argv`, :func:`fmt_value`, :func:`loader_args` - flag pairs as argv, a value as text; loader
  settings by where the weights are read.
* :func:`read_concurrency` - the concurrent reads of the weights those flags cause.
"""
from __future__ import annotations

import json

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, loads_json

DEFAULT_COMMAND = {
    "vllm": ["vllm", "serve"],
    "sglang": ["python3", "-m", "sglang.launch_server"],
}

# Init processes that forward signals, reap children and exit with the engine's status (128 + signal when it
# was killed): tini (krallin/tini src/tini.c reap_zombies) and dumb-init (Yelp/dumb-init README).
INIT_ARGS = {"tini": ["-g", "--"], "dumb-init": ["--"]}


def fmt_value(value):
    """A flag's or a variable's value as text: ``true``/``false``, mappings and lists as compact JSON."""
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
            argv.append(fmt_value(value))
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
            raise _k8s_checks.SpecError(
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
        raise _k8s_checks.SpecError("%s; give it as a JSON object such as {\"enable_multithread_load\": true, \"num_threads\": 8}" % e)
    if not isinstance(value, dict):
        raise _k8s_checks.SpecError("engine_args: model-loader-extra-config must be a JSON object such as "
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
    pairs, _min = _k8s_checks.profile_entry(p["profiles"], p["profile"], engine)
    threads = p["loader_threads"] or _k8s_checks.LOADER_THREADS[p["model_source"]]
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
    return [p["init"]] + INIT_ARGS[_k8s_checks.init_flavour(p["init"])] + list(command)
