"""Property-based checks of the AWX workflow rule the stand-in restates (tests/lib/awx_harness.py ``WorkflowDAG``).

The invariants:

* on any graph and any job outcomes (successful or failed where a node converges), the workflow job fails exactly when a node that ran failed (failed, error,
  canceled) and has neither a failure nor an always edge (``has_workflow_failed``, awx/main/scheduler/
  dag_workflow.py), every node either ran or was marked do_not_run, and no node ran before a parent that could
  still reach it;
* for every workflow of awx/, whatever its job templates and approvals do, the workflow ends failed whenever any of
  its steps failed, and successful only when every step that ran succeeded. The diagnosis on a failure edge fails
  whenever its node hands it ``diagnose_fail_after`` (the role fails after diagnosing when that is set:
  tests/unit/test_awx_workflow.py runs it for real).
"""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

OBJECTS = awx.load_controller()
STATUSES = st.sampled_from(["successful", "failed", "error", "canceled"])


class Finished:
    def __init__(self, status):
        self.status = status
        self.artifacts = {}


@st.composite
def graphs(draw):
    """A DAG of 1-7 nodes (edges only from a lower to a higher index) with random edge kinds and convergence."""
    size = draw(st.integers(min_value=1, max_value=7))
    nodes = []
    for i in range(size):
        related = {}
        for j in range(i + 1, size):
            kind = draw(st.sampled_from([None, None, "success_nodes", "failure_nodes", "always_nodes"]))
            if kind:
                related.setdefault(kind, []).append({"identifier": "n%d" % j})
        nodes.append({"identifier": "n%d" % i, "unified_job_template": {"name": "n%d" % i, "type": "job_template"},
                      "related": related, "all_parents_must_converge": draw(st.booleans())})
    return nodes


@settings(max_examples=300, deadline=None)
@given(graphs(), st.data())
def test_the_workflow_fails_exactly_when_a_failed_node_has_no_error_handling_edge(nodes, data):
    # upstream's convergence check (_all_parents_met_convergence_criteria) weighs only successful and failed parents:
    # an errored or canceled parent of an ALL node leaves it undecided there too (no workflow of awx/ converges)
    converge = any(n["all_parents_must_converge"] for n in nodes)
    kinds = st.sampled_from(["successful", "failed"]) if converge else STATUSES
    outcomes = {n["identifier"]: data.draw(kinds, label=n["identifier"]) for n in nodes}
    order = []

    def run_node(ident, node):
        order.append(ident)
        return Finished(outcomes[ident])

    wfjt = {"name": "g", "workflow_nodes": nodes, "notification_templates_error": ["e"],
            "notification_templates_success": ["s"]}
    run = awx.drive_workflow(wfjt, run_node)
    dag = awx.WorkflowDAG(nodes)
    unhandled = [i for i in run if run[i].status in awx.FAILED_STATUSES
                 and not dag.children[i]["failure_nodes"] and not dag.children[i]["always_nodes"]]
    assert (run.status == "failed") is bool(unhandled)
    assert run.notified == (("e",) if unhandled else ("s",))
    assert set(run) | set(run.not_run) == {n["identifier"] for n in nodes} and not set(run) & set(run.not_run)
    for ident in run:
        for parent, kind in dag.parents[ident]:
            if parent in run:
                assert order.index(parent) < order.index(ident), (parent, ident)
            else:
                assert parent in run.not_run


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_failure_in_a_workflow_of_awx_ends_it_successful(data):
    for wfjt in OBJECTS["controller_workflows"]:
        outcome = {}

        def run_node(ident, node, wfjt=wfjt, outcome=outcome):  # pylint: disable=dangerous-default-value
            ujt = node["unified_job_template"]
            if ujt["type"] == "workflow_approval":
                job = awx.Approval(data.draw(st.sampled_from(["approve", "deny", "timeout"]), label=ident))
            else:
                template = awx.by_name(OBJECTS["controller_templates"], ujt["name"])
                runtime = awx.node_runtime_vars(template, node, {}, awx.job_extra_vars(wfjt, {}))
                status = data.draw(STATUSES, label=ident)
                if ujt["name"] == "llmops diagnose" and runtime.get("diagnose_fail_after"):
                    status = "failed"  # the role fails after diagnosing whatever the verdict
                job = Finished(status)
            outcome[ident] = job.status
            return job

        run = awx.drive_workflow(dict(wfjt, notification_templates_error=["e"], notification_templates_success=["s"]),
                                 run_node)
        any_failed = any(s in awx.FAILED_STATUSES for s in outcome.values())
        assert run.status == ("failed" if any_failed else "successful"), outcome
        assert run.notified == (("e",) if any_failed else ("s",))
