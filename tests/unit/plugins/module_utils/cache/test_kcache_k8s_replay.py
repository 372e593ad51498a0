"""Kernel caches on Kubernetes, end to end, replayed offline: the roles' own tasks, the cluster as its controllers
run it, every GPU node its own NVMe.

The kernel_cache role's tasks (roles/kernel_cache/tasks/main.yml, publish.yml; their arguments and conditions
templated by tests/lib/role_tasks.py from the role's defaults and the example inventory) run against a node-local
cache root per node; the engine role's ``engine_manifests`` task renders the pod with what the role exported; the
objects go to the cluster model of tests/lib/kube_controllers.py (scheduler filters and the kubelet's hostPath check
of tests/lib/kube_scheduler.py), whose engine, once its container runs, compiles through its cache env into the
node's directory (a miss, logged as vLLM logs one) or loads what is there (a hit); ``k8s_engine_wait`` judges the
rollout with the role's arguments, and playbooks/site.yml's publish condition decides, per node, whether the
capture is published.

Before (production review 2, m5): on a miss the role checked nothing out, the pod got no cache volume and no cache
env (``kernel_cache_dir``/``kernel_cache_env`` empty), compiled into its container filesystem, and nothing
published it; every start repaid the JIT.
"""
from __future__ import annotations

import os

import yaml

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build, _kcache_log
from ansible_collections.llmops.serving.plugins.modules import engine_manifests, k8s_engine_wait, kernel_cache
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.lib import role_tasks as rt

EXAMPLE = "inventories/example-h20/group_vars/all/main.yml"
MODEL = "/mnt/nvme/models/GLM-5.2-FP8/3f2a9c1"
FP = "9e8d7c6b5a4f3e2d"
GPU = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1Ti"}
HIT_LINE = "(EngineCore_DP0 pid=311) INFO [backends.py:215] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 4.1 s"
MISS_LINE = "(EngineCore_DP0 pid=311) INFO [backends.py:224] Compiling a graph for compile range (1, 8192) takes 96.3 s"


def _dict2items(d, key_name="key", value_name="value"):
    return [{key_name: k, value_name: v} for k, v in (d or {}).items()]


class Fleet(object):
    """GPU nodes, each with its own NVMe: the cache root every node uses (one path, as in the inventory) is a link
    switched to the node a step runs on."""

    def __init__(self, tmp_path, names):
        self.tmp, self.names = tmp_path, list(names)
        self.root = str(tmp_path / "mnt" / "nvme" / "kernel-cache")
        self.proc = str(tmp_path / "proc")  # no process of the test host counts as a user
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        for n in self.names:
            os.makedirs(str(tmp_path / ("nvme-" + n)), exist_ok=True)
        self.logs = {}

    def on(self, node):
        link = self.root + ".next"
        os.symlink(str(self.tmp / ("nvme-" + node)), link)
        os.replace(link, self.root)
        return self

    def exists(self, node, path):
        self.on(node)
        return os.path.isdir(path)


def cache_vars(fleet, **facts):
    overrides = dict(kernel_cache_root=fleet.root, kernel_cache_proc_root=fleet.proc,
                     _kernel_cache_fp={"fingerprint": FP, "label": "vllm 0.26.0 H20 tp8",
                                       "components": {"engine": "vllm", "engine_version": "0.26.0", "tp": 8}})
    overrides.update(facts)
    with open(os.path.join(rt.ROOT, EXAMPLE), encoding="utf-8") as f:
        inventory = yaml.safe_load(f)
    for key in ("kernel_cache_engine", "kernel_cache_prebuild"):
        overrides.setdefault(key, inventory[key])
    return rt.RoleVars("kernel_cache", overrides, data=tuple(k for k in facts if k.startswith("_")))


def _when(variables, task, extra=None):
    conds = task.get("when") or []
    conds = conds if isinstance(conds, list) else [conds]
    return all(variables.template("{{ (%s) | bool }}" % c, extra) for c in conds)


def run_cache_role(run_module, fleet, node, **inventory):
    """The kernel_cache role on one GPU node (prebuild off, as in the example): every kernel_cache task of
    roles/kernel_cache/tasks/main.yml in order, skipped unless its conditions hold (a skipped task still registers
    its variable), then the exported facts and the gc step with them."""
    fleet.on(node)
    inventory = dict(inventory, inventory_hostname=node)
    variables = cache_vars(fleet, **inventory)
    reg = {"_kernel_cache_fp": variables.get("_kernel_cache_fp")}
    gc = None
    for task in rt._walk(rt._tasks(os.path.join(rt.ROOT, "roles", "kernel_cache", "tasks", "main.yml"))):  # pylint: disable=protected-access
        if "llmops.serving.kernel_cache" not in task:
            continue
        if task["llmops.serving.kernel_cache"]["operation"] == "gc":
            gc = task
            continue
        result = {"skipped": True, "changed": False}
        if _when(variables, task, reg):
            result = run_module(kernel_cache, variables.template(task["llmops.serving.kernel_cache"], reg))
            assert not result.get("failed"), (task["name"], result.get("msg"))
        if task.get("register"):
            reg[task["register"]] = result
    facts = {}
    for task in rt._walk(rt._tasks(os.path.join(rt.ROOT, "roles", "kernel_cache", "tasks", "main.yml"))):  # pylint: disable=protected-access
        if "ansible.builtin.set_fact" in task and task["name"].startswith("Export"):
            facts.update(variables.template(task["ansible.builtin.set_fact"], reg))
    out = run_module(kernel_cache, cache_vars(fleet, **dict(inventory, **facts)).template(gc["llmops.serving.kernel_cache"]))
    assert not out.get("failed"), out.get("msg")
    return facts, reg


def render(run_module, tmp_path, facts, staged, replicas=1):
    """The engine role's engine_manifests task with the kernel_cache facts of the host it runs once on."""
    variables = rt.RoleVars("engine", dict(engine_staged_nodes=staged, engine_model_path=MODEL, engine_replicas=replicas,
                                           **facts), extra_vars_files=[EXAMPLE, "roles/engine/vars/profiles.yml"])
    variables.env.filters["dict2items"] = _dict2items
    task = rt.task("engine", "llmops.serving.engine_manifests", "kubernetes.yml")
    args = variables.template(task["llmops.serving.engine_manifests"])
    args["render_dir"] = str(tmp_path / "render")
    rendered = run_module(engine_manifests, args)
    assert not rendered.get("failed"), rendered.get("msg")
    return variables, rendered


def _engine_container(pod):
    return pod["spec"]["containers"][0]


class EngineOnNode(object):
    """The engine process in a running pod: its cache env names paths on its node (the hostPath is mounted at the
    same path); it loads what is there or compiles and writes it, and logs which, as vLLM does."""

    def __init__(self, fleet):
        self.fleet, self.started = fleet, {}

    def __call__(self, cluster):
        for pod in cluster.pods.values():
            uid = pod["metadata"]["uid"]
            if uid in self.started or "running" not in pod["status"]["containerStatuses"][0]["state"]:
                continue
            node = pod["spec"]["nodeName"]
            env = dict((e["name"], e.get("value")) for e in _engine_container(pod).get("env") or [])
            mounted = [m["mountPath"] for m in _engine_container(pod)["volumeMounts"]]
            triton = env.get("TRITON_CACHE_DIR")
            self.fleet.on(node)
            lines = ["INFO Using cache directory: %s/torch_compile/abc123 for vLLM's torch.compile"
                     % (env.get("VLLM_CACHE_ROOT") or "/root/.cache/vllm")]
            if triton and any((triton + "/").startswith(m.rstrip("/") + "/") for m in mounted) and \
                    os.path.isfile(os.path.join(triton, "k1", "gemm.cubin")):
                lines.append(HIT_LINE)
            else:
                lines.append(MISS_LINE)
                if triton and any((triton + "/").startswith(m.rstrip("/") + "/") for m in mounted):
                    os.makedirs(os.path.join(triton, "k1"), exist_ok=True)
                    with open(os.path.join(triton, "k1", "gemm.cubin"), "wb") as f:
                        f.write(b"sm90 fp8 gemm for " + node.encode())
                    dg = os.path.join(env["DG_JIT_CACHE_DIR"], "cache")
                    os.makedirs(dg, exist_ok=True)
                    with open(os.path.join(dg, "kernel.fp8_gemm.0a1b2c3d4e5f"), "wb") as f:
                        f.write(b"deepgemm")
            self.started[uid] = (node, "\n".join(lines) + "\n")


def deploy(fleet, rendered, nodes):
    cluster = kc.Cluster(namespace=rendered["objects"][0]["metadata"]["namespace"], fleet=[
        ks.node(n, labels={"nvidia.com/gpu.product": "NVIDIA-H20"}, allocatable=GPU,
                dirs=[MODEL] + [p for p in _cache_dirs(rendered) if fleet.exists(n, p)]) for n in nodes])
    for obj in rendered["objects"]:
        cluster.apply(obj)
    return cluster


def _cache_dirs(rendered):
    return [v["hostPath"]["path"] for o in rendered["objects"] if o["kind"] == "Deployment"
            for v in o["spec"]["template"]["spec"]["volumes"] if v["name"] == "kernel-cache"]


def wait(run_module, variables, rendered, cluster, engine, limit=900, step=10):
    task = rt.task("engine", "llmops.serving.k8s_engine_wait", "kubernetes.yml")
    args = variables.template(task["llmops.serving.k8s_engine_wait"], dict(engine_k8s=rendered))
    for _i in range(limit // step):
        cluster.advance(step)
        engine(cluster)
        result = run_module(k8s_engine_wait, dict(args, objects={"apiVersion": "v1", "kind": "List",
                                                                 "items": cluster.objects()}))
        if result["state"] in ("ready", "failed", "timeout"):
            return result
    return result


def publish_on(run_module, fleet, node, facts, rollout, **extra):
    """playbooks/site.yml's publish task on one host of the engine play: its conditions, then
    roles/kernel_cache/tasks/publish.yml."""
    with open(os.path.join(rt.ROOT, "playbooks", "site.yml"), encoding="utf-8") as f:
        plays = yaml.safe_load(f)
    task = next(t for p in plays for t in p.get("tasks") or []
                if t.get("name") == "Publish the kernel cache the engine compiled at its first start")
    host = cache_vars(fleet, **dict(facts, engine_platform="kubernetes", engine_k8s_mode="apply", k8s_node_name=node,
                                    inventory_hostname=node, ansible_check_mode=False, kernel_cache_enabled=True,
                                    engine_rollout=rollout, **extra))
    if not _when(host, task):
        return None
    fleet.on(node)
    results = {}
    for t in rt._tasks(os.path.join(rt.ROOT, "roles", "kernel_cache", "tasks", "publish.yml")):  # pylint: disable=protected-access
        if "llmops.serving.kernel_cache" not in t or not _when(host, t, results):
            continue
        out = run_module(kernel_cache, host.template(t["llmops.serving.kernel_cache"], results))
        assert not out.get("failed"), out.get("msg")
        results[t.get("register") or t["name"]] = out
    return results


def test_first_deploy_misses_and_publishes_the_second_start_mounts_the_checkout_and_hits(run_module, tmp_path):
    fleet = Fleet(tmp_path, ["gpu-01"])
    facts, reg = run_cache_role(run_module, fleet, "gpu-01")
    rd = _kcache.run_dir(fleet.root, "vllm", FP, "engine")
    # the miss: an empty per-start directory and an env pointing into it, for the pod
    assert reg["_kernel_cache_final"]["status"] == "missing" and reg["_kernel_cache_capture"]["status"] == "created"
    assert facts["kernel_cache_engine_dir"] == rd and facts["kernel_cache_capturing"] is True
    assert facts["kernel_cache_env"]["TRITON_CACHE_DIR"] == rd + "/triton"
    variables, rendered = render(run_module, tmp_path, facts, ["gpu-01"])
    assert _cache_dirs(rendered) == [rd]
    pod_env = dict((e["name"], e.get("value")) for o in rendered["objects"] if o["kind"] == "Deployment"
                   for e in o["spec"]["template"]["spec"]["containers"][0]["env"])
    assert pod_env["DG_JIT_CACHE_DIR"] == rd + "/deep_gemm"
    cluster = deploy(fleet, rendered, ["gpu-01"])
    engine = EngineOnNode(fleet)
    rollout = wait(run_module, variables, rendered, cluster, engine)
    assert rollout["state"] == "ready", rollout["msg"]
    [(node, log)] = list(engine.started.values())
    assert node == "gpu-01" and _kcache_log.analyze_log(log, "vllm", rd)["result"] == "miss"
    fleet.on("gpu-01")
    assert not os.path.exists(_kcache.fingerprint_dir(fleet.root, "vllm", FP))  # nothing before the answer
    out = publish_on(run_module, fleet, "gpu-01", facts, rollout)
    pub = out["_kernel_cache_published"]
    assert pub["status"] == "published" and pub["details"]["sequence"] == 1
    final = _kcache.fingerprint_dir(fleet.root, "vllm", FP)
    assert _kcache.verify_dir(final, FP, facts["kernel_cache_components"], allow_extra=False)["ok"]

    # the next run: a hit, the checkout at the same path, so the Deployment is not rolled
    facts2, reg2 = run_cache_role(run_module, fleet, "gpu-01")
    assert reg2["_kernel_cache_final"]["status"] == "hit" and reg2["_kernel_cache_capture"].get("skipped")
    assert reg2["_kernel_cache_checkout"]["status"] == "ready" and facts2["kernel_cache_capturing"] is False
    assert facts2["kernel_cache_engine_dir"] == rd and facts2["kernel_cache_env"] == facts["kernel_cache_env"]
    _v2, rendered2 = render(run_module, tmp_path, facts2, ["gpu-01"])
    dep = next(o for o in rendered2["objects"] if o["kind"] == "Deployment")
    generation = cluster.deployments[dep["metadata"]["name"]]["metadata"]["generation"]
    cluster.apply(dep)
    assert cluster.deployments[dep["metadata"]["name"]]["metadata"]["generation"] == generation
    assert publish_on(run_module, fleet, "gpu-01", facts2, rollout) is None  # nothing to publish on a hit

    # the second start (the pod recreated): it mounts the checkout and its log shows hits
    pod = next(iter(cluster.pods.values()))
    pod["metadata"]["deletionTimestamp"], pod["x-terminating-since"] = cluster._iso(), cluster.t  # pylint: disable=protected-access
    rollout2 = wait(run_module, variables, rendered2, cluster, engine)
    assert rollout2["state"] == "ready", rollout2["msg"]
    second = [v for k, v in engine.started.items() if k != pod["metadata"]["uid"]]
    assert len(second) == 1
    fleet.on("gpu-01")
    report = _kcache_build.start_report(fleet.root, "vllm", FP, second[0][1], "engine")
    assert report["result"] == "hit" and report["hit_lines"] == [HIT_LINE] and report["new_files"] == []
    assert report["published_unchanged"] is True


def test_two_nodes_missing_at_once_build_once_per_fingerprint_per_store(run_module, tmp_path):
    """Two replicas on two staged nodes, both missing: each pod compiles into its own node's per-start directory;
    each node publishes once into its own NVMe store, and the shared store gets the fingerprint once (the first
    pusher wins, the second finds it there). A rerun publishes nothing."""
    nodes = ["gpu-01", "gpu-02"]
    fleet = Fleet(tmp_path, nodes + ["gpu-03"])
    store = str(tmp_path / "shared-store")
    facts = {}
    for n in nodes:
        # the store does not hold the fingerprint yet: a miss to capture, not a failed copy
        facts[n], reg = run_cache_role(run_module, fleet, n, kernel_cache_store_root=store)
        assert reg["_kernel_cache_store"]["status"] == "missing" and reg["_kernel_cache_final"]["status"] == "missing"
        assert reg["_kernel_cache_capture"]["status"] == "created"
    assert facts["gpu-01"]["kernel_cache_engine_dir"] == facts["gpu-02"]["kernel_cache_engine_dir"]
    variables, rendered = render(run_module, tmp_path, facts["gpu-01"], nodes, replicas=2)  # run_once: the first host
    cluster = deploy(fleet, rendered, nodes)
    engine = EngineOnNode(fleet)
    rollout = wait(run_module, variables, rendered, cluster, engine)
    assert rollout["state"] == "ready", rollout["msg"]
    assert sorted(n for n, _log in engine.started.values()) == nodes
    outcomes = dict((n, publish_on(run_module, fleet, n, facts[n], rollout, kernel_cache_store_root=store))
                    for n in nodes)
    assert [outcomes[n]["_kernel_cache_published"]["status"] for n in nodes] == ["published", "published"]
    pushes = [outcomes[n]["Push the published cache to the shared store (the first host to push a fingerprint wins)"]
              ["status"] for n in nodes]
    assert pushes == ["copied", "hit"]
    for n in nodes:
        fleet.on(n)
        published = [d for d in os.listdir(os.path.join(fleet.root, "vllm")) if _kcache.FP_RE.match(d)]
        assert published == [FP] and _kcache.read_manifest(os.path.join(fleet.root, "vllm", FP))["sequence"] == 1
        with open(os.path.join(fleet.root, "vllm", FP, "triton", "k1", "gemm.cubin"), "rb") as f:
            assert f.read() == b"sm90 fp8 gemm for " + n.encode()  # each node's own compile, never the other's
    assert _kcache.read_manifest(os.path.join(store, "vllm", FP))["producer_host"]
    again = publish_on(run_module, fleet, "gpu-01", facts["gpu-01"], rollout, kernel_cache_store_root=store)
    assert again["_kernel_cache_published"]["status"] == "hit"
    # a node added later copies the fingerprint from the store, verified, and starts on its checkout
    later, reg = run_cache_role(run_module, fleet, "gpu-03", kernel_cache_store_root=store)
    assert reg["_kernel_cache_store"]["status"] == "hit"
    assert reg["_kernel_cache_final"]["status"] == "hit" and reg["_kernel_cache_capture"].get("skipped")
    assert later["kernel_cache_engine_dir"] == facts["gpu-01"]["kernel_cache_engine_dir"]


def test_a_node_that_runs_no_current_pod_publishes_nothing(run_module, tmp_path):
    """Two staged nodes, one replica: the node without the pod has an empty capture; site.yml's condition skips it,
    and the publish itself would find nothing to publish."""
    nodes = ["gpu-01", "gpu-02"]
    fleet = Fleet(tmp_path, nodes)
    facts = dict((n, run_cache_role(run_module, fleet, n)[0]) for n in nodes)
    variables, rendered = render(run_module, tmp_path, facts["gpu-01"], nodes, replicas=1)
    cluster = deploy(fleet, rendered, nodes)
    engine = EngineOnNode(fleet)
    rollout = wait(run_module, variables, rendered, cluster, engine)
    assert rollout["state"] == "ready", rollout["msg"]
    [(ran, dummy)] = list(engine.started.values())
    idle = next(n for n in nodes if n != ran)
    assert publish_on(run_module, fleet, idle, facts[idle], rollout) is None
    fleet.on(idle)
    direct = run_module(kernel_cache, dict(operation="publish_capture", cache_root=fleet.root, engine="vllm",
                                           fingerprint=FP, components=facts[idle]["kernel_cache_components"],
                                           proc_root=fleet.proc))
    assert direct["status"] == "empty" and not os.path.exists(_kcache.fingerprint_dir(fleet.root, "vllm", FP))
    assert publish_on(run_module, fleet, ran, facts[ran], rollout)["_kernel_cache_published"]["status"] == "published"


def test_a_mount_path_the_pod_does_not_have_is_refused_before_rendering(tmp_path):
    """kernel_cache_mount_path (/cache) names where a local container sees its cache; a Kubernetes engine mounts the
    directory at its node path, so the env would point outside the mount: the engine role refuses it, naming it."""
    task = rt.task("engine", "ansible.builtin.assert", "kubernetes.yml",
                   name="Refuse a kernel-cache mount path the pod does not have")
    rd = "/mnt/nvme/kernel-cache/vllm/.run/%s-engine" % FP
    for mount_path, ok in (("", True), ("/cache", False)):
        variables = rt.RoleVars("engine", dict(kernel_cache_mount_path=mount_path, kernel_cache_engine_dir=rd),
                                extra_vars_files=[EXAMPLE, "roles/engine/vars/profiles.yml"])
        assert variables.template("{{ %s }}" % task["ansible.builtin.assert"]["that"]) is ok
    msg = variables.template(task["ansible.builtin.assert"]["fail_msg"])
    assert "kernel_cache_mount_path is /cache" in msg and rd in msg
