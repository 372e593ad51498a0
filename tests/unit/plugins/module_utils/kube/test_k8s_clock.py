"""Ages on a cluster are API time minus API time (kube/_k8s_clock): a controller whose wall clock is off by any amount
judges a rollout exactly as one whose clock is right.

The API server's time of a read is the ``Date`` header of its answers (RFC 9110 section 6.6.1; Go's net/http server
behind kube-apiserver sets it on every answer, ``net/http/server.go`` ``(*response).WriteHeader`` ->
``w.conn.server... setDate``) or, without one, the newest time its objects carry; between reads the module's
monotonic clock carries it.
"""
from __future__ import annotations

import ast
import copy
import email.utils
import os
import time

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_pods, _k8s_clock, _k8s_shape
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait as w

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))))
FIX = os.path.join(ROOT, "tests", "unit", "fixtures", "k8s")
with open(os.path.join(FIX, "pods.yaml")) as f:
    PODS = yaml.safe_load(f)
T0 = _k8s_shape.parse_time("2026-08-02T08:00:05Z")  # never_scheduled's creationTimestamp
AHEAD = 20 * 60


def _no_fit_pod():
    """A pod kube-scheduler reports no node can take even with preemption (``preemption.go``: "Preemption is not
    helpful for scheduling" on every node): ``pod_blocked`` fails it once that has lasted a minute."""
    pod = copy.deepcopy(PODS["never_scheduled"])
    pod["status"]["conditions"][0]["message"] = ("0/12 nodes are available: 12 node(s) didn't match Pod's node "
                                                 "affinity/selector. preemption: 0/12 nodes are available: 12 "
                                                 "Preemption is not helpful for scheduling.")
    return pod


def _date(epoch):
    return email.utils.formatdate(epoch, usegmt=True)


class _Monotonic(object):
    def __init__(self):
        self.t = 1000.0

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s


def _wait(pod, server_age, controller_ahead, monkeypatch, timeout=20, schedule_timeout=900, dated=True):
    """wait_rollout over one pod read from an API server whose clock says ``server_age`` s after the pod's creation,
    with this host's wall clock ``controller_ahead`` s ahead of the cluster."""
    monkeypatch.setattr(time, "time", lambda: T0 + server_age + controller_ahead)
    mono = _Monotonic()

    def fetch():
        return dict(pods=[pod], route=None, dates=[_date(T0 + server_age + (mono.t - 1000.0))] if dated else [])
    return w.wait_rollout(fetch, timeout=timeout, poll_interval=10, check_route=False, clock=mono.clock,
                          sleep=mono.sleep, schedule_timeout=schedule_timeout)


@pytest.mark.parametrize("pod, limit", [(PODS["never_scheduled"], "limit 900s"), (_no_fit_pod(), None)],
                         ids=["schedule_timeout", "no_feasible_node"])
def test_a_controller_20_minutes_ahead_does_not_fail_a_pod_pending_for_5_s(monkeypatch, pod, limit):
    """The defect: now = time.time() on the controller, 20 min ahead, minus creationTimestamp read 1,205 s pending."""
    v = _wait(pod, 5, AHEAD, monkeypatch)
    assert v["state"] == "timeout", v["message"]
    assert "not scheduled" in v["message"] and "1205" not in v["message"] and "1225" not in v["message"]


@pytest.mark.parametrize("pod, age, needle", [(PODS["never_scheduled"], 901, "(for 901s, limit 900s)"),
                                              (_no_fit_pod(), 61, "no node can ever take it")],
                         ids=["schedule_timeout", "no_feasible_node"])
@pytest.mark.parametrize("ahead", [AHEAD, 0, -AHEAD])
def test_a_pod_pending_past_the_limit_by_the_servers_clock_still_fails(monkeypatch, pod, age, needle, ahead):
    v = _wait(pod, age, ahead, monkeypatch)
    assert v["state"] == "failed" and needle in v["message"], v["message"]
    assert v["polls"] == 1


def test_without_a_date_header_the_modules_monotonic_clock_ages_the_pod(monkeypatch):
    """Objects that carry no newer time than the pod's creation (no Date, no Event): the pod still ages by the
    seconds this module watched it, and fails past the limit - by the monotonic clock, not the wall clock (here a
    day ahead)."""
    v = _wait(PODS["never_scheduled"], 5, 86400, monkeypatch, timeout=3600, schedule_timeout=100, dated=False)
    assert v["state"] == "failed" and "limit 100s" in v["message"], v["message"]
    assert 100 <= v["elapsed"] <= 120


def test_a_recorded_read_is_judged_at_its_own_newest_time():
    pod = _no_fit_pod()
    assert _k8s_clock.read_time([pod]) == T0
    assert w.judge(lambda: dict(pods=[pod], route=None), check_route=False)["state"] == "waiting"
    late = w.judge(lambda: dict(pods=[pod], route=None, dates=[_date(T0 + 61)]), check_route=False)
    assert late["state"] == "failed" and "no node can ever take it" in late["message"]


def test_server_clock_carries_the_best_read_forward():
    mono = _Monotonic()
    sc = _k8s_clock.ServerClock(mono.clock)
    assert sc.at(None) is None
    assert sc.at(T0) == T0
    mono.sleep(30)
    assert sc.at(T0) == T0 + 30  # an older read does not move the clock back
    assert sc.at(None) == T0 + 30
    mono.sleep(5)
    assert sc.at(T0 + 100) == T0 + 100  # a read that knows better raises it
    mono.sleep(1)
    assert sc.at(None) == T0 + 101


def test_http_date_and_age():
    assert _k8s_clock.http_date("Sun, 02 Aug 2026 08:00:05 GMT") == T0
    for bad in (None, "", "yesterday", "Sun, 02 Aug 2026 08:00:05", 5):
        assert _k8s_clock.http_date(bad) is None
    assert _k8s_clock.read_time([PODS["never_scheduled"]], ["Sun, 02 Aug 2026 08:01:05 GMT"]) == T0 + 60
    assert _k8s_clock.age(T0 + 5, T0) == 5 and _k8s_clock.age(T0, T0 + 5) == 0 and _k8s_clock.age(None, T0) is None


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(skew=st.integers(-7 * 86400, 7 * 86400), age=st.integers(0, 2000),
       which=st.sampled_from(["never_scheduled", "no_fit"]))
def test_property_the_verdict_does_not_depend_on_the_controllers_wall_clock(skew, age, which):
    """For any skew of this host's clock and any age by the API server's clock, the wait's verdict is the one a host
    with the right clock reaches, and it fails exactly when the server's age passes the limit."""
    pod = PODS["never_scheduled"] if which == "never_scheduled" else _no_fit_pod()
    verdicts = []
    for ahead in (0, skew):
        mp = pytest.MonkeyPatch()
        try:
            v = _wait(pod, age, ahead, mp, timeout=0)
        finally:
            mp.undo()
        verdicts.append((v["state"], v["message"]))
    assert verdicts[0] == verdicts[1]
    limit = 900 if which == "never_scheduled" else _diagnose_pods.NO_FIT_PERSIST_SECONDS
    assert (verdicts[0][0] == "failed") == (age > limit if which == "never_scheduled" else age >= limit)


# --------------------------------------------------------------------------------------------- #
# Cannot bypass: no kube/ file and no module that judges cluster objects reads the wall clock
# --------------------------------------------------------------------------------------------- #

KUBE = os.path.join(ROOT, "plugins", "module_utils", "kube")
MODULES = os.path.join(ROOT, "plugins", "modules")
#: calls that read this host's wall clock (time.time and friends, datetime.now/utcnow/today, date.today)
WALL = {("time", "time"), ("time", "time_ns"), ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
        ("date", "today")}
NO_ARG_WALL = {("time", "localtime"), ("time", "gmtime"), ("time", "ctime"), ("time", "asctime")}
#: file -> why it may read the wall clock (none: an age on a cluster is API time minus API time, kube/_k8s_clock)
ALLOWED = {}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return tuple(reversed(parts))


def wall_clock_reads(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name[-2:] in WALL:
                bad.append("%s:%d %s" % (os.path.relpath(path, ROOT), node.lineno, ".".join(name)))
        if isinstance(node, ast.Call) and not node.args and _dotted(node.func)[-2:] in NO_ARG_WALL:
            bad.append("%s:%d %s()" % (os.path.relpath(path, ROOT), node.lineno, ".".join(_dotted(node.func))))
        if isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime") and any(
                (node.module.split(".")[-1], a.name) in WALL | NO_ARG_WALL for a in node.names):
            bad.append("%s:%d from %s import" % (os.path.relpath(path, ROOT), node.lineno, node.module))
    return bad


def _judging_files():
    files = [os.path.join(KUBE, n) for n in sorted(os.listdir(KUBE)) if n.endswith(".py")]
    for n in sorted(os.listdir(MODULES)):
        path = os.path.join(MODULES, n)
        if n.endswith(".py"):
            with open(path, encoding="utf-8") as f:
                if "module_utils.kube import" in f.read():
                    files.append(path)
    return files


def test_no_kube_judgement_reads_the_wall_clock():
    files = _judging_files()
    assert any(p.endswith("k8s_engine_wait.py") for p in files) and any(p.endswith("_diagnose_pods.py") for p in files)
    bad = [b for p in files if os.path.relpath(p, ROOT) not in ALLOWED for b in wall_clock_reads(p)]
    assert not bad, ("these read this host's wall clock where a cluster's age is judged; take the API server's time "
                     "of the read (kube/_k8s_clock.read_time / ServerClock) or a monotonic duration instead: %s" % bad)


def test_the_scan_sees_each_way_of_reading_the_wall_clock(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("import time, datetime\nfrom time import time as now\na = time.time()\nb = datetime.datetime.now()\n"
                   "c = datetime.datetime.utcnow()\nd = time.localtime()\ne = time.monotonic()\n"
                   "f = time.gmtime(0)\ng = time.time\n")
    got = sorted(b.split(" ", 1)[1] for b in wall_clock_reads(str(src)))
    assert got == ["datetime.datetime.now", "datetime.datetime.utcnow", "from time import", "time.localtime()",
                   "time.time", "time.time"], got
