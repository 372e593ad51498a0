"""Property-based harness for the verdicts on recorded Kubernetes objects (engine_diagnose, k8s_engine_wait).

Recorded objects are untrusted: any field of any object may hold the wrong type, null, a number out of range, a
nesting of lists, or be absent. For every such change the invariants a user relies on are checked:

* ``_diagnose_k8s.diagnose_kubernetes`` and ``_k8s_wait.evaluate`` answer (a verdict, never a traceback);
* a verdict of ``healthy`` needs evidence: at least one pod of the workload Ready, and every pod of it Ready
  (a pod that is not Ready - whatever its status lacks - is never healthy);
* the wait's ``ready`` needs as many Ready pods as replicas and, with a workload, its rollout done.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import copy
import math
import os

import yaml
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose
from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_k8s, _k8s_shape, _k8s_wait
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "150"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "unit", "fixtures", "diagnose")


def _scenarios():
    out = []
    for name in ("healthy_vllm", "sglang_completed_exit0", "startup_probe_web_sized", "route_dotted_service",
                 "unschedulable_gpus", "unschedulable_rdma"):
        with open(os.path.join(FIX, name + ".yaml")) as f:
            out.append(yaml.safe_load(f))
    with open(os.path.join(FIX, "containers.yaml")) as f:
        for key, sc in yaml.safe_load(f).items():
            if not key.startswith("_"):
                out.append(dict(sc, namespace="llm-lab", name="glm-5-2-fp8-vllm", served_model_name="glm-5.2-fp8-vllm"))
    # a rollout in the middle, from the controller model: ReplicaSets of two revisions, Events, a loading pod
    cluster = kc.Cluster()
    cluster.apply(kc.deployment("/models/a", replicas=2))
    cluster.advance(150)
    cluster.apply(kc.deployment("/models/b", replicas=2))
    cluster.advance(20)
    out.append(dict(objects=cluster.objects(), logs={}, namespace="llm-lab", name="glm-5-2-fp8-vllm",
                    served_model_name="glm-5.2-fp8-vllm", now=_timeline.iso(cluster.clock())))
    return out


SCENARIOS = _scenarios()

# What a hostile or broken recorder may put in any field.
hostile = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "True", "False", "Evicted", "Failed", "2026-13-45T99:99:99Z", "99999-01-01T00:00:00Z",
                     "ImagePullBackOff", "spec.containers{engine}", "Killing", "-1"]),
    st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=4)), max_size=3),
    st.dictionaries(st.text(max_size=6), st.one_of(st.none(), st.integers(), st.text(max_size=4)), max_size=3),
    st.just([[[[]]]]), st.just({"running": None, "terminated": 7}),
)
DELETE = object()


def _mutate(doc, data):
    """Walk from the root along keys/indexes the test draws, then replace the value there (or delete it)."""
    node = doc
    while True:
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node, key=str)))
        elif isinstance(node, list) and node:
            key = data.draw(st.integers(0, len(node) - 1))
        else:
            return
        child = node[key]
        if not isinstance(child, (dict, list)) or not child or data.draw(st.integers(0, 3)) == 0:
            value = data.draw(st.one_of(hostile, st.just(DELETE)))
            if value is DELETE and isinstance(node, dict):
                del node[key]
            elif value is DELETE:
                node.pop(key)
            else:
                node[key] = copy.deepcopy(value)  # a later change must not alter the strategy's constant
            return
        node = child


def _ready(pod):
    return (_k8s_shape.condition((pod.get("status") or {}).get("conditions"), "Ready") or {}).get("status") == "True"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("LLMOPS_FUZZ_SHRINK"), phases=PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(which=st.integers(0, len(SCENARIOS) - 1), changes=st.integers(1, 4), data=st.data())
def test_wrong_typed_fields_never_raise_and_healthy_needs_ready_pods(which, changes, data):
    sc = SCENARIOS[which]
    objects = copy.deepcopy(sc["objects"])
    logs = copy.deepcopy(sc.get("logs") or {})
    doc = {"objects": objects, "logs": logs}
    for _i in range(changes):
        _mutate(doc, data)
    objects, logs = doc.get("objects"), doc.get("logs")
    now = _timeline.parse_time(sc["now"])
    res = _diagnose_k8s.diagnose_kubernetes(objects, logs, namespace=sc["namespace"], name=sc["name"],
                                            served_model_name=sc.get("served_model_name"), now=now)
    assert res["verdict"] in _diagnose.SEVERITY
    assert isinstance(res["summary"], str) and all(isinstance(f["evidence"], list) for f in res["findings"])
    shaped = _k8s_shape.shape_objects(objects)
    pods = [p for p in shaped if p["kind"] == "Pod" and p["metadata"].get("namespace") == sc["namespace"]
            and not p["metadata"].get("deletionTimestamp")]
    if res["verdict"] == "healthy":
        assert pods and all(_ready(p) for p in pods), res

    workload = next((o for o in shaped if o["kind"] in _diagnose_k8s.WORKLOAD_KINDS), None)
    verdict = _k8s_wait.evaluate(pods, None, now=now, check_route=False, workload=workload,
                                 replicasets=[o for o in shaped if o["kind"] == "ReplicaSet"],
                                 events=[o for o in shaped if o["kind"] == "Event"], logs={})
    assert verdict["state"] in ("ready", "waiting", "failed")
    if verdict["state"] == "ready":  # as many Ready pods as replicas (1 here), and a rollout that is done
        assert sum(1 for p in verdict["pods"] if p["state"] == "ready") >= 1
        assert verdict["rollout"] is None or verdict["rollout"]["state"] == "done"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("LLMOPS_FUZZ_SHRINK"), phases=PHASES,
          suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile)
def test_any_value_in_place_of_the_object_list_is_judged_not_raised(value):
    res = _diagnose_k8s.diagnose_kubernetes(value if not isinstance(value, float) or math.isfinite(value) else None,
                                            value, namespace="llm-lab", name="glm-5-2-fp8-vllm")
    assert res["verdict"] != "healthy"
    assert _k8s_shape.shape_objects(value) == [] or isinstance(value, (list, dict))
