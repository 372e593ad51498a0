"""A module starts a child only through ``common/_process_run``, and takes a lock only on a file opened by
``_fsutil.open_lock_file`` (docs/development.md, "Where each idea lives").

``_process_run.Child`` / ``run`` / ``python_json`` register every child, so a signalled module (SIGTERM, SIGHUP,
SIGINT) stops it and removes its ``.partial-*`` directories. A ``subprocess.Popen``, ``os.fork``,
``AnsibleModule.run_command`` or the like anywhere else in plugins/ would start a child that outlives the module:
this scan fails on one, naming the file, the line and the way through. :data:`ALLOWED` names the few processes
that must outlive the module on purpose, each with its owner and why.

``flock`` needs only a descriptor, read-only or not (flock(2)): a lock file another local user can open is a lock
that user can hold to stop every run. ``_fsutil.open_lock_file`` creates it 0600 and makes an older one of this
user 0600. :func:`lock_violations` fails on a function or class that flocks without opening its file that way;
:data:`LOCKS_ALLOWED` names the exceptions and why.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = os.path.join(ROOT, "plugins")

#: module -> the names through which that module starts a process
STARTERS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnl", "spawnle", "spawnlp",
           "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "execl", "execle", "execlp", "execlpe", "execv",
           "execve", "execvp", "execvpe"},
    "pty": {"fork", "spawn"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}
#: modules whose mere import starts processes (worker pools)
POOLS = ("multiprocessing", "concurrent.futures.process")

#: file (relative to plugins/) -> {way through: why it may}
ALLOWED = {
    "module_utils/common/_process_run.py": {
        "subprocess.Popen": "the one way: Child, run and python_json register what they start",
    },
    "module_utils/engine/_process.py": {
        "subprocess.Popen": "engine_process's supervisor daemonises on purpose: the engine must outlive the task; "
                            "state=stopped (NameLock, stop) ends it",
    },
    "module_utils/stage/_stage_peer.py": {
        "os.fork": "the fan-out peer server daemonises on purpose (double fork, setsid) to serve other hosts after "
                   "the task; model_stage_peer state=absent and its lifetime end it",
    },
}


def _aliases(tree):
    """Local name -> the module it stands for (``import subprocess as sp``) or ``module.name``
    (``from subprocess import Popen as P``), for the modules of :data:`STARTERS`."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in STARTERS:
                    names[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module in STARTERS:
            for a in node.names:
                names[a.asname or a.name] = "%s.%s" % (node.module, a.name)
    return names


def starters(path):
    """``(line, way)`` for every way ``path`` could start a process."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod = names.get(node.value.id)
            if mod in STARTERS and node.attr in STARTERS[mod]:
                out.append((node.lineno, "%s.%s" % (mod, node.attr)))
        if isinstance(node, ast.Attribute) and node.attr == "run_command":
            out.append((node.lineno, "run_command"))
        if isinstance(node, ast.ImportFrom) and node.module in STARTERS:
            out += [(node.lineno, "%s.%s" % (node.module, a.name)) for a in node.names
                    if a.name in STARTERS[node.module]]
        mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        out += [(node.lineno, "import %s" % m) for m in mods if m.startswith(POOLS)]
    return sorted(set(out))


def violations(plugins=PLUGINS, allowed=None):
    """Every way a file under ``plugins`` starts a process other than through ``_process_run``, and every
    allow-list entry no file uses any more."""
    allowed = ALLOWED if allowed is None else allowed
    bad, used = [], set()
    for dirpath, dirnames, filenames in os.walk(plugins):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(dirpath, name), plugins)
            for line, way in starters(os.path.join(dirpath, name)):
                if way in allowed.get(rel, {}):
                    used.add((rel, way))
                    continue
                bad.append("plugins/%s:%d starts a process with %s; use common/_process_run (Child for a command "
                           "that runs a while, run for a short one), which stops it when the module is signalled"
                           % (rel, line, way))
    for rel, ways in sorted(allowed.items()):
        for way in sorted(ways):
            if (rel, way) not in used:
                bad.append("plugins/%s: allowed %s but no longer uses it; remove it from ALLOWED" % (rel, way))
    return bad


#: file (relative to plugins/) -> {function or class: why it may flock a descriptor it opened itself}
LOCKS_ALLOWED = {
    "module_utils/common/_fsutil.py": {
        "try_flock": "the flock itself, on a descriptor its caller opened", "wait_flock": "the same, waiting",
    },
    "module_utils/common/_clock.py": {
        "sequence_lock": "a lock on the engine root directory itself: a holder delays a publish by at most its "
                         "timeout, then the order falls back to names (_clock.order_key)",
    },
    "module_utils/cache/_kcache.py": {
        "lock_is_free": "only tries the lock file fingerprint_lock made (open_lock_file), creates nothing",
    },
    "module_utils/engine/_process.py": {
        "NameLock": "opens its own lock file with the ownership checks of one engine per name (_open_lock)",
    },
    "module_utils/stage/_stage_peer.py": {
        "running": "only tries the pid file the daemon made 0600 (no file is created)",
        "_daemon": "the daemon's pid file, created 0600 and O_NOFOLLOW by the daemon itself",
    },
}
FLOCKS = ("flock", "try_flock", "wait_flock")


def _calls(node, names):
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in names:
                return n.lineno
    return None


def lock_violations(plugins=PLUGINS, allowed=None):
    """Every top-level function or class under ``plugins`` that flocks without ``open_lock_file``, and every
    :data:`LOCKS_ALLOWED` entry no longer needed."""
    allowed = LOCKS_ALLOWED if allowed is None else allowed
    bad, used = [], set()
    for dirpath, dirnames, filenames in os.walk(plugins):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(dirpath, name), plugins)
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    continue
                line = _calls(node, FLOCKS)
                if line is None or _calls(node, ("open_lock_file",)) is not None:
                    continue
                if node.name in allowed.get(rel, {}):
                    used.add((rel, node.name))
                    continue
                bad.append("plugins/%s:%d %s flocks a file it did not open with _fsutil.open_lock_file (0600, no "
                           "symlink): another user who can open that file can hold the lock" % (rel, line, node.name))
    for rel, names in sorted(allowed.items()):
        for n in sorted(names):
            if (rel, n) not in used:
                bad.append("plugins/%s: %s is in LOCKS_ALLOWED but no longer flocks; remove it" % (rel, n))
    return bad


def test_every_lock_file_is_opened_so_that_no_other_user_can_hold_it():
    assert lock_violations() == []


def test_a_lock_on_a_file_opened_another_way_is_named(tmp_path):
    (tmp_path / "module_utils" / "x").mkdir(parents=True)
    (tmp_path / "module_utils" / "x" / "_l.py").write_text(
        "import fcntl, os\n"
        "def good(p):\n    fd = _fsutil.open_lock_file(p)\n    _fsutil.wait_flock(fd, 1)\n"
        "def bad(p):\n    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)\n    fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "class Bad(object):\n    def enter(self):\n        _fsutil.try_flock(open(self.p, 'a').fileno())\n")
    assert lock_violations(str(tmp_path), {"module_utils/y.py": {"gone": "stale"}}) == [
        "plugins/module_utils/x/_l.py:7 bad flocks a file it did not open with _fsutil.open_lock_file (0600, no "
        "symlink): another user who can open that file can hold the lock",
        "plugins/module_utils/x/_l.py:10 Bad flocks a file it did not open with _fsutil.open_lock_file (0600, no "
        "symlink): another user who can open that file can hold the lock",
        "plugins/module_utils/y.py: gone is in LOCKS_ALLOWED but no longer flocks; remove it"]


def test_every_child_is_started_through_process_run():
    assert violations() == []


def test_a_child_started_another_way_is_named_with_its_file_and_line(tmp_path):
    files = {
        "modules/m.py": "def main(module):\n    module.run_command(['sleep', '9'])\n",
        "module_utils/x/_a.py": "import subprocess as sp\nsp.Popen(['x'])\n",
        "module_utils/x/_b.py": "from subprocess import check_output\nimport os\nos.fork()\nos.execvp('x', [])\n",
        "module_utils/x/_c.py": "import multiprocessing\nfrom concurrent.futures.process import ProcessPoolExecutor\n",
        "module_utils/x/_d.py": "import subprocess\ndef f(run=subprocess.run):\n    return subprocess.TimeoutExpired\n",
        "module_utils/common/_process_run.py": "import subprocess\nsubprocess.Popen\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = violations(str(tmp_path), {"module_utils/common/_process_run.py": {"subprocess.Popen": "owner"},
                                     "module_utils/gone.py": {"os.fork": "stale"}})
    assert [g.split(" starts")[0].split(": allowed")[0] for g in got] == [
        "plugins/module_utils/x/_a.py:2", "plugins/module_utils/x/_b.py:1", "plugins/module_utils/x/_b.py:3",
        "plugins/module_utils/x/_b.py:4", "plugins/module_utils/x/_c.py:1", "plugins/module_utils/x/_c.py:2",
        "plugins/module_utils/x/_d.py:2", "plugins/modules/m.py:2", "plugins/module_utils/gone.py"]
    assert "with run_command; use common/_process_run" in got[7]
    assert "subprocess.check_output" in got[1] and "os.fork" in got[2] and "os.execvp" in got[3]
