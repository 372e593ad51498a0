"""A signalled module stops the children it started and removes its scratch directories (_process_run's registry).

Real module-like processes (a Python interpreter running the collection's code, as AnsiballZ runs a module) start
real children: the kernel-cache warm-up (``_kcache_build.prebuild`` into a ``.partial-*`` directory), the
benchmark's load client (``_bench_round.run_client``), a :class:`_process_run.Child`, a :func:`_process_run.run`
command. Each child writes its pid and the pid of a worker in its process group, then sleeps; the test sends the
module SIGTERM, SIGHUP or SIGINT and checks that every one of those pids is gone, no ``.partial-*`` remains and
the module ended with 128 + the signal number. Before the registry, the module died at once and its children
(in their own session) and the ``.partial-*`` directory stayed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import ansible_collections.llmops.serving as collection
from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import as_a_module_starts

TREE = os.path.dirname(os.path.dirname(os.path.dirname(list(collection.__path__)[0])))

# The child: a worker in its process group, both pids written (atomically) to argv[1], then sleep. With "ignore",
# SIGTERM is ignored by it and by the worker (an ignored signal stays ignored across exec): only SIGKILL ends them.
FAKE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    if sys.argv[2] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen(["sleep", "120"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write("%d %d" % (os.getpid(), worker.pid))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(120)
""")

# The module: what it runs, then "returned" on stdout (it never gets there: the test signals it first).
DRIVER = textwrap.dedent("""
    import json, signal, sys
    from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
    what, fake, pidfile, work, how = sys.argv[1:6]
    cmd = [sys.executable, fake, pidfile, how]
    if "--ignore-hup" in sys.argv:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if "--own-handler" in sys.argv:
        def own(signum, frame):
            with open(work + "/own-handler", "w") as f:
                f.write(str(signum))
            sys.exit(7)
        signal.signal(signal.SIGTERM, own)
    if what == "prebuild":
        from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache_build
        _kcache_build.prebuild(work + "/cache", "vllm", "0123456789abcdef", {"engine": "vllm"},
                               {"command": cmd, "mode": "run", "timeout": 600})
    elif what == "bench":
        from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_round
        _bench_round.run_client(cmd, work + "/client.log", 0)
    elif what == "child":
        _process_run.Child(cmd, work + "/child.log", grace=float(sys.argv[6])).wait()
    elif what == "run":
        _process_run.run(cmd, timeout=600)
    print("returned", flush=True)
""")


def _alive(pid):
    st = _process_run.proc_stat(pid)
    return st is not None and st["state"] not in ("Z", "X")


def _wait_for(cond, within):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _start(tmp_path, what, how="obey", *extra):
    fake = tmp_path / "fake_engine.py"
    fake.write_text(FAKE)
    pidfile = tmp_path / "pids"
    env = dict(os.environ, PYTHONPATH=TREE)
    mod = subprocess.Popen([sys.executable, "-c", DRIVER, what, str(fake), str(pidfile), str(tmp_path), how]
                           + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                           preexec_fn=as_a_module_starts)
    if not _wait_for(pidfile.exists, 30):
        mod.kill()
        raise AssertionError("the child never started: %s" % (mod.communicate(),))
    return mod, [int(x) for x in pidfile.read_text().split()]


def _finish(mod, timeout=30):
    try:
        out, err = mod.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        mod.kill()
        raise
    return mod.returncode, out, err


@pytest.fixture
def reap():
    """Pids a failing test must not leave behind."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _partials(root):
    out = []
    for dirpath, dirnames, dummy in os.walk(root):
        out += [os.path.join(dirpath, d) for d in dirnames if d.startswith(".partial-")]
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signalled_kernel_cache_build_stops_its_warm_up_and_leaves_no_partial(tmp_path, reap, sig):
    mod, pids = _start(tmp_path, "prebuild")
    reap.extend(pids)
    assert len(_partials(tmp_path / "cache")) == 1  # the build directory exists while the warm-up runs
    mod.send_signal(sig)
    rc, out, err = _finish(mod)
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []
    assert _partials(tmp_path / "cache") == []
    assert not os.path.exists(tmp_path / "cache" / "vllm" / "0123456789abcdef")  # nothing was published
    assert rc == 128 + sig and "returned" not in out, (rc, err)


def test_signalled_benchmark_stops_its_load_client(tmp_path, reap):
    mod, pids = _start(tmp_path, "bench")
    reap.extend(pids)
    mod.send_signal(signal.SIGHUP)  # the controller's connection went away
    rc, dummy, err = _finish(mod)
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []
    assert rc == 128 + signal.SIGHUP, err


def test_a_child_that_ignores_sigterm_is_killed_after_its_grace(tmp_path, reap):
    mod, pids = _start(tmp_path, "child", "ignore", "0.5")
    reap.extend(pids)
    t0 = time.monotonic()
    mod.send_signal(signal.SIGTERM)
    rc, dummy, err = _finish(mod)
    assert rc == 128 + signal.SIGTERM, err
    assert time.monotonic() - t0 < 10  # the grace (0.5 s), then SIGKILL: not the 120 s the child sleeps
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []


def test_sigint_stops_a_short_command(tmp_path, reap):
    mod, pids = _start(tmp_path, "run")
    reap.extend(pids)
    mod.send_signal(signal.SIGINT)
    rc, dummy, err = _finish(mod)
    assert rc == 128 + signal.SIGINT, err
    assert "Traceback" not in err
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []


def test_an_ignored_sighup_stays_ignored_and_sigterm_still_stops(tmp_path, reap):
    """Under nohup, SIGHUP is ignored: the module and its child go on; a later SIGTERM still stops both."""
    mod, pids = _start(tmp_path, "child", "obey", "5", "--ignore-hup")
    reap.extend(pids)
    mod.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert mod.poll() is None and all(_alive(p) for p in pids)
    mod.send_signal(signal.SIGTERM)
    rc, dummy, err = _finish(mod)
    assert rc == 128 + signal.SIGTERM, err
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []


def test_a_handler_installed_before_runs_after_the_children_are_stopped(tmp_path, reap):
    mod, pids = _start(tmp_path, "child", "obey", "5", "--own-handler")
    reap.extend(pids)
    mod.send_signal(signal.SIGTERM)
    rc, dummy, err = _finish(mod)
    assert rc == 7, err  # the module's own handler decided how it ends
    assert (tmp_path / "own-handler").read_text() == str(int(signal.SIGTERM))
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []


def test_a_child_that_ended_with_its_group_is_no_longer_registered(tmp_path):
    """Its pid may be reused by an unrelated process group: a later signal must not reach that group."""
    child = _process_run.Child([sys.executable, "-c", "pass"], str(tmp_path / "log"))
    assert id(child) in _process_run._REG.children  # pylint: disable=protected-access
    assert child.wait(10) == 0
    assert id(child) not in _process_run._REG.children  # pylint: disable=protected-access
    assert _process_run.stop_registered() == 0


def test_scratch_dir_is_removed_unless_renamed_away(tmp_path):
    with _process_run.scratch_dir(".partial-x-", str(tmp_path)) as kept:
        os.rename(kept, str(tmp_path / "published"))
    assert os.listdir(tmp_path) == ["published"]
    with pytest.raises(RuntimeError):
        with _process_run.scratch_dir(".partial-y-", str(tmp_path)) as failed:
            open(os.path.join(failed, "half"), "w").close()
            raise RuntimeError("the build failed")
    assert os.listdir(tmp_path) == ["published"]


def test_run_keeps_subprocess_run_semantics(tmp_path):
    done = _process_run.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], timeout=30,
                            input="abc", capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "ABC")
    with pytest.raises(subprocess.TimeoutExpired):
        _process_run.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)
    with pytest.raises(subprocess.CalledProcessError):
        _process_run.run([sys.executable, "-c", "raise SystemExit(3)"], timeout=30, check=True)
    assert _process_run._REG.children == {}  # pylint: disable=protected-access


def test_a_signal_between_a_start_and_its_registration_waits_for_the_registration(tmp_path, reap, monkeypatch):
    """The handler is deferred while a child is started and registered; the signal is handled on the way out,
    and then finds the child (here the signal is delivered by calling the handler, as Python would)."""
    _process_run.install()
    monkeypatch.setattr(_process_run._REG, "previous", {})  # pylint: disable=protected-access
    fake = tmp_path / "fake_engine.py"
    fake.write_text(FAKE)
    pidfile = tmp_path / "pids"
    with pytest.raises(SystemExit) as e:
        with _process_run._deferred():  # pylint: disable=protected-access
            child = _process_run.Child([sys.executable, str(fake), str(pidfile), "obey"], str(tmp_path / "log"))
            assert _wait_for(pidfile.exists, 30)
            pids = [int(x) for x in pidfile.read_text().split()]
            reap.extend(pids)
            _process_run._on_signal(signal.SIGTERM, None)  # pylint: disable=protected-access
            assert all(_alive(p) for p in pids)  # deferred: nothing stopped yet
    assert e.value.code == 128 + signal.SIGTERM
    assert [p for p in pids if not _wait_for(lambda p=p: not _alive(p), 5)] == []
    assert id(child) not in _process_run._REG.children  # pylint: disable=protected-access
