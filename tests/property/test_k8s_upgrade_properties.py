"""Property-based harness for the Kubernetes upgrade plan (kube/_k8s_upgrade.py): for any replica counts of A and
B and any spare room on the nodes that staged B, the plan is either refused before anything changes or every step,
applied in order to A's objects, keeps these invariants:

* P/D generations never mix: every front reaches prefill and decode Deployments of its own generation only (checked
  here from the objects by a reach of this file's own: the Service a vLLM proxy's ``--prefill``/``--decode`` URL
  names, and that Service's selector against each Deployment's pod labels);
* something serves at every step: the model's Service selects a front whose generation has at least one prefill and
  one decode replica (unless the plan says it accepted an outage);
* the GPUs are never over-asked: after each step, A's and B's engine replicas of a role fit on the nodes that staged
  that role (one pod a node);
* the end is B only: the model's Service selects B's front, no Deployment of A is left, B has its replicas;
* a single Deployment's canary is beside A exactly when a staged node has room, its waves add up to the replicas
  and never surge past the room.

CI runs a bounded number of examples; ``LLMOPS_FUZZ_EXAMPLES`` raises it.
"""
from __future__ import annotations

import os

from hypothesis import given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_upgrade as up

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "60"))
NS = "llm"
GPU = {"limits": {"nvidia.com/gpu": "8"}}


def _dep(name, role, replicas, labels=None, args=None, path="/m/a"):
    pod_labels = {up.NAME_LABEL: name, up.ROLE_LABEL: role, up.MODEL_LABEL: "m"}
    pod_labels.update(labels or {})
    container = {"name": "engine" if role != "front" else "pd-proxy", "image": "img", "resources": GPU if role != "front" else {},
                 "args": args if args is not None else [path, "--port", "8000"]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {up.NAME_LABEL: name}},
                     "template": {"metadata": {"labels": pod_labels}, "spec": {"containers": [container]}}}}


def _svc(name, selector):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": selector, "ports": [{"port": 8000}]}}


def pair(path, prefill, decode, front=1):
    """A P/D pair of Deployments as pd_manifests renders it (vLLM proxy form), reduced to what the plan reads."""
    urls = ["--prefill", "http://m-prefill.%s.svc:8000" % NS, "--decode", "http://m-decode.%s.svc:8000" % NS]
    return [_dep("m-prefill", "prefill", prefill, path=path), _svc("m-prefill", {up.NAME_LABEL: "m-prefill"}),
            _dep("m-decode", "decode", decode, path=path), _svc("m-decode", {up.NAME_LABEL: "m-decode"}),
            _dep("m-pd-proxy", "front", front, args=urls), _svc("m", {up.NAME_LABEL: "m-pd-proxy"})]


def nodes(a_prefill, a_decode, free_prefill, free_decode):
    """A's pods fill one node each; ``free_*`` more nodes staged B for each role. Returns (nodes, staged)."""
    out, staged = [], {"prefill": [], "decode": []}
    for role, busy, free in (("prefill", a_prefill, free_prefill), ("decode", a_decode, free_decode)):
        for i in range(busy + free):
            name = "%s-%d" % (role, i)
            out.append({"name": name, "allocatable": 8, "allocated": 8 if i < busy else 0})
            staged[role].append(name)
    return out, staged


def reach(objects):
    """``{front name: (its generation, {generations it reaches})}``, computed from the objects directly."""
    services = dict((o["metadata"]["name"], o) for o in objects if o["kind"] == "Service")
    deps = [o for o in objects if o["kind"] == "Deployment"]

    def labels(d):
        return d["spec"]["template"]["metadata"]["labels"]

    out = {}
    for front in (d for d in deps if labels(d)[up.ROLE_LABEL] == "front"):
        args = front["spec"]["template"]["spec"]["containers"][0]["args"]
        gens = set()
        for flag in ("--prefill", "--decode"):
            host = args[args.index(flag) + 1].split("//")[1].split(".")[0]
            sel = services[host]["spec"]["selector"] if host in services else None
            for d in deps:
                if sel and labels(d)[up.ROLE_LABEL] != "front" and all(labels(d).get(k) == v for k, v in sel.items()):
                    gens.add(labels(d).get(up.GENERATION_LABEL, "A"))
        out[front["metadata"]["name"]] = (labels(front).get(up.GENERATION_LABEL, "A"), gens)
    return out


def serving(objects):
    """Whether the model's Service selects a front whose own generation has a prefill and a decode replica."""
    svc = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "m")
    deps = [o for o in objects if o["kind"] == "Deployment"]
    for front in deps:
        lab = front["spec"]["template"]["metadata"]["labels"]
        if lab[up.ROLE_LABEL] != "front" or front["spec"]["replicas"] < 1:
            continue
        if not all(lab.get(k) == v for k, v in svc["spec"]["selector"].items()):
            continue
        gen = lab.get(up.GENERATION_LABEL, "A")
        have = dict((d["spec"]["template"]["metadata"]["labels"][up.ROLE_LABEL], d["spec"]["replicas"]) for d in deps
                    if d["spec"]["template"]["metadata"]["labels"].get(up.GENERATION_LABEL, "A") == gen)
        if have.get("prefill", 0) >= 1 and have.get("decode", 0) >= 1:
            return True
    return False


@settings(max_examples=EXAMPLES, deadline=None)
@given(a_pre=st.integers(1, 4), a_dec=st.integers(1, 4), b_pre=st.integers(1, 4), b_dec=st.integers(1, 4),
       free_pre=st.integers(0, 3), free_dec=st.integers(0, 3), allow=st.booleans())
def test_every_step_of_a_pd_plan_keeps_generations_apart_and_something_serving(
        a_pre, a_dec, b_pre, b_dec, free_pre, free_dec, allow):
    live = pair("/m/a", a_pre, a_dec)
    rendered = pair("/m/b", b_pre, b_dec)
    fleet, staged = nodes(a_pre, a_dec, free_pre, free_dec)
    capacity = {"prefill": a_pre + free_pre, "decode": a_dec + free_dec}
    try:
        plan = up.plan(live, rendered, fleet, staged, allow_outage=allow)
    except up.UpgradeError as e:
        # refused only for an outage it was not allowed to cause (a role with one replica and no room), or for a B
        # that asks more pods of a role than the nodes that staged it hold
        if e.reason == "outage":
            assert not allow and ((a_pre == 1 and free_pre == 0) or (a_dec == 1 and free_dec == 0)), str(e)
        else:
            assert e.reason == "capacity" and (b_pre > capacity["prefill"] or b_dec > capacity["decode"]), str(e)
        return
    assert b_pre <= capacity["prefill"] and b_dec <= capacity["decode"]
    state = [dict(o) for o in live]
    for i, step in enumerate(plan["steps"]):
        state = up._state_after(state, [step])  # pylint: disable=protected-access
        for front, (gen, gens) in reach(state).items():
            assert gens <= {gen}, (step["name"], front, gen, gens)
        if not plan["outage"]:
            assert serving(state), step["name"]
        for role in ("prefill", "decode"):
            asked = sum(d["spec"]["replicas"] for d in state if d["kind"] == "Deployment"
                        and d["spec"]["template"]["metadata"]["labels"][up.ROLE_LABEL] == role)
            assert asked <= capacity[role], (step["name"], role, asked, capacity[role])
    gen_b = plan["generations"]["b"]
    assert not [o for o in state if o["kind"] == "Deployment" and up.GENERATION_LABEL not in o["spec"]["template"]["metadata"]["labels"]]
    svc = next(o for o in state if o["kind"] == "Service" and o["metadata"]["name"] == "m")
    assert svc["spec"]["selector"] == {up.NAME_LABEL: "m-pd-proxy-%s" % gen_b}
    final = dict((d["spec"]["template"]["metadata"]["labels"][up.ROLE_LABEL], d["spec"]["replicas"]) for d in state
                 if d["kind"] == "Deployment")
    assert final == {"prefill": b_pre, "decode": b_dec, "front": 1}
    # the rollback deletes exactly what B added and re-applies every object of A
    assert sorted((r["kind"], r["name"]) for r in plan["rollback"]["delete"]) == sorted(
        [("Deployment", "%s-%s" % (n, gen_b)) for n in ("m-prefill", "m-decode", "m-pd-proxy")]
        + [("Service", "%s-%s" % (n, gen_b)) for n in ("m-prefill", "m-decode")])
    assert plan["rollback"]["apply"] == [up.recorded(o) for o in live]


@settings(max_examples=EXAMPLES, deadline=None)
@given(replicas=st.integers(1, 6), free=st.integers(0, 4), allow=st.booleans())
def test_a_deployment_canary_goes_beside_a_exactly_when_there_is_room(replicas, free, allow):
    def dep(path, n):
        d = _dep("e", "engine", n, path=path)
        d["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        return d

    fleet = [{"name": "n%d" % i, "allocatable": 8, "allocated": 8 if i < replicas else 0} for i in range(replicas + free)]
    staged = [n["name"] for n in fleet]
    try:
        plan = up.plan([dep("/m/a", replicas)], [dep("/m/b", replicas)], fleet, staged, allow_outage=allow)
    except up.UpgradeError as e:
        assert e.reason == "outage" and replicas == 1 and free == 0 and not allow
        return
    assert plan["surge"] == min(free, replicas)
    assert plan["outage"] == (replicas == 1 and free == 0)
    beside = not plan["steps"][0]["name"].startswith("make room")
    assert beside == (free > 0)
    assert sum(plan["waves"]) == replicas and max(plan["waves"]) <= max(1, free)
    rolling = plan["steps"][-1]["apply"][-1]["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxSurge"] <= free and (rolling["maxSurge"] > 0 or rolling["maxUnavailable"] == 1)
    assert plan["rollback"] == {"delete": [{"kind": "Deployment", "name": "e-canary", "apiVersion": "apps/v1"}], "apply": [dep("/m/a", replicas)],
                                "wait": [{"kind": "Deployment", "name": "e", "replicas": replicas,
                                          "selector": dep("/m/a", replicas)["spec"]["selector"]["matchLabels"]}]}
