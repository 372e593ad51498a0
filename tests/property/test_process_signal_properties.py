"""Property-based harness for _process_run's registry: a signalled module leaves no child and no scratch directory.

A module-like process (a Python interpreter running the collection's code) follows a generated plan: start
children that obey or ignore SIGTERM (:class:`_process_run.Child`, each with a worker in its process group), run
short commands that time out (:func:`_process_run.run`), stop some children, open and close scratch
directories (:func:`_process_run.scratch_dir`, the ``.partial-*`` builds), sleep. The test sends it SIGTERM,
SIGHUP or SIGINT after a generated delay, whatever it is doing then (importing, starting a child, between a
start and its registration, stopping one, removing a directory). The invariants:

* every process any child started (leader and worker, each recorded by the process itself) is gone once the
  module has exited;
* no ``.partial-*`` directory remains;
* the module ended with 128 + the signal number, or by the signal itself when it came before the module started
  anything (the handler is installed before the first child).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import ansible_collections.llmops.serving as collection
from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import as_a_module_starts

TREE = os.path.dirname(os.path.dirname(os.path.dirname(list(collection.__path__)[0])))
EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "15"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + (
    [Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# A child: a worker in its process group; both pids recorded in a file of its own; then sleep.
FAKE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    if sys.argv[2] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen(["sleep", "120"])
    path = os.path.join(sys.argv[1], "%d" % os.getpid())
    with open(path + ".tmp", "w") as f:
        f.write("%d %d" % (os.getpid(), worker.pid))
    os.rename(path + ".tmp", path)
    time.sleep(120)
""")

DRIVER = textwrap.dedent("""
    import contextlib, json, os, subprocess, sys, time
    from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
    fake, pids, work, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    children, scratch = [], contextlib.ExitStack()
    open_dirs = []
    for step in plan:
        kind = step[0]
        if kind == "child":
            children.append(_process_run.Child([sys.executable, fake, pids, step[1]], os.devnull, grace=step[2]))
        elif kind == "run":
            try:
                _process_run.run([sys.executable, fake, pids, step[1]], timeout=step[2])
            except subprocess.TimeoutExpired:
                pass
        elif kind == "stop" and children:
            children.pop(step[1] % len(children)).stop(grace=0.2)
        elif kind == "scratch":
            stack = contextlib.ExitStack()
            path = stack.enter_context(_process_run.scratch_dir(".partial-p-", work))
            with open(os.path.join(path, "half-built"), "w") as f:
                f.write("x" * 1000)
            open_dirs.append(stack)
        elif kind == "unscratch" and open_dirs:
            open_dirs.pop(0).close()
        elif kind == "sleep":
            time.sleep(step[1])
    time.sleep(60)
""")


GRACE = st.sampled_from([0.1, 0.3])
STEP = st.one_of(
    st.tuples(st.just("child"), st.sampled_from(["obey", "ignore"]), GRACE),
    st.tuples(st.just("run"), st.sampled_from(["obey", "ignore"]), st.sampled_from([0.05, 0.3])),
    st.tuples(st.just("stop"), st.integers(0, 5)),
    st.tuples(st.just("scratch")),
    st.tuples(st.just("unscratch")),
    st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.02, 0.1])),
)


def _alive(pid):
    st_ = _process_run.proc_stat(pid)
    return st_ is not None and st_["state"] not in ("Z", "X")


def _recorded(pids_dir):
    out = []
    for name in os.listdir(pids_dir):
        if not name.endswith(".tmp"):
            with open(os.path.join(pids_dir, name)) as f:
                out += [int(x) for x in f.read().split()]
    return out


@SETTINGS
@given(plan=st.lists(STEP, min_size=1, max_size=8), delay=st.sampled_from([0.0, 0.15, 0.3, 0.5, 0.8, 1.2]),
       sig=st.sampled_from([signal.SIGTERM, signal.SIGHUP, signal.SIGINT]))
def test_a_signalled_module_leaves_no_registered_child_and_no_partial(tmp_path_factory, plan, delay, sig):
    work = tmp_path_factory.mktemp("signalled")
    pids = work / "pids"
    pids.mkdir()
    fake = work / "fake.py"
    fake.write_text(FAKE)
    mod = subprocess.Popen([sys.executable, "-c", DRIVER, str(fake), str(pids), str(work), json.dumps(plan)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=TREE),
                           text=True, preexec_fn=as_a_module_starts)
    time.sleep(delay)
    mod.send_signal(sig)
    try:
        dummy, err = mod.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        mod.kill()
        raise
    try:
        assert mod.returncode in (128 + sig, -sig), (mod.returncode, err)
        time.sleep(0.2)  # a child that escaped would record itself by now
        left = [p for p in _recorded(str(pids)) if _alive(p)]
        assert left == [], "plan %s, signal %d after %ss: still running %s" % (plan, sig, delay, left)
        assert [n for n in os.listdir(str(work)) if n.startswith(".partial-")] == []
    finally:
        for pid in _recorded(str(pids)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
