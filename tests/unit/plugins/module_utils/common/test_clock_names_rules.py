"""Nothing in plugins/ goes around ``common/_clock`` or ``common/_names`` (docs/reliability.md, "clocks" and "names").

Clocks: a wall-clock reading (``time.time()``, ``datetime.now()``, a file's ``st_mtime`` / ``getmtime``, or a
name assigned from one, or a callable defaulting to ``time.time``) is never an operand of ``-`` / ``+`` or of an
ordering comparison, nor part of a sort key: durations use ``_clock.Stopwatch`` / ``deadline`` (monotonic), ages
``_clock.age`` of two times from one clock, order ``_clock.order_key`` over a publish sequence. Timestamps written
for people stay (a wall reading stored or printed is not compared). :data:`CLOCK_ALLOWED` names the files that
still do it, how many times, and why; a new site anywhere fails.

Names: only ``common/_names.py`` normalises Unicode (``unicodedata``); every file that reads pins names them
here and goes through ``_names`` (or pins by an identity no spelling changes), and every suffix staging appends
to a name is one ``_names.check_component`` checks.
"""
from __future__ import annotations

import ast
import os

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout, _stage_marker

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
PLUGINS = os.path.join(ROOT, "plugins")

#: file (relative to plugins/) -> (sites allowed at most, why). Fewer sites than allowed is fine (a fix elsewhere
#: lands without editing this table); more fails. Only the owner is left: every other file measures through it.
CLOCK_ALLOWED = {
    "module_utils/common/_clock.py": (99, "the owner: Stopwatch, Deadline and age subtract readings of one clock"),
}

#: Files that once compared wall-clock readings and now go through ``_clock`` (0 sites, not in the allow-list).
CLOCK_FIXED = (
    "module_utils/engine/_process.py",         # the supervisor's stop_timeout: time.monotonic in its own interpreter
    "module_utils/engine/_probe.py",           # probe_seconds: _clock.Stopwatch
    "module_utils/engine/_diagnose_local.py",  # ages: _clock.process_age, filesystem_now + age, age of one clock
    "module_utils/stage/_stage_peer.py",       # board age: filesystem_now + age
    "module_utils/bench/_bench_plan.py",       # elapsed since the plan: _clock.elapsed_since of host_instant
    "module_utils/bench/_bench_round.py",      # the time budget: _bench_plan.elapsed
    "modules/benchmark_plan.py",               # records _clock.host_instant beside started_at (for people)
)

WALL_CALLS = {("time", "time"), ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
              ("path", "getmtime"), ("path", "getctime"), ("path", "getatime")}
WALL_ATTRS = {"st_mtime", "st_ctime", "st_atime", "st_mtime_ns", "st_ctime_ns", "st_atime_ns"}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return inner + "." + node.attr if inner else None
    return None


def _is_wall_callable(node):
    """``time.time`` itself (not called): a default or an alias that is called later."""
    return isinstance(node, ast.Attribute) and node.attr == "time" and _dotted(node.value) == "time"


class _Scope(object):
    def __init__(self, values=(), callables=()):
        self.values = set(values)          # names / dotted attributes holding a wall reading
        self.callables = set(callables)    # names that are time.time


def _source(node, scope):
    """``node`` is a wall-clock reading (see the module docstring)."""
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and (f.value.id if isinstance(f.value, ast.Name) else
                                             getattr(f.value, "attr", None), f.attr) in WALL_CALLS:
            return True
        name = _dotted(f)
        return name is not None and name in scope.callables
    if isinstance(node, ast.Attribute) and node.attr in WALL_ATTRS:
        return True
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _dotted(node) in scope.values
    if isinstance(node, ast.IfExp):
        return _source(node.body, scope) or _source(node.orelse, scope)
    if isinstance(node, ast.BoolOp):
        return any(_source(v, scope) for v in node.values)
    return False


def _scope_of(fn, outer):
    scope = _Scope(outer.values, outer.callables)
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = fn.args
        positional = args.posonlyargs + args.args
        for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            if _is_wall_callable(default):
                scope.callables.add(arg.arg)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None and _is_wall_callable(default):
                scope.callables.add(arg.arg)
    for _round in range(2):  # a name assigned from a name assigned from a reading
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for t in targets:
                name = _dotted(t)
                if name is None:
                    continue
                if _source(value, scope):
                    scope.values.add(name)
                elif _is_wall_callable(value) or (isinstance(value, ast.BoolOp)
                                                  and any(_is_wall_callable(v) for v in value.values)):
                    scope.callables.add(name)
    return scope


def clock_sites(path):
    """``[(line, what)]``: wall-clock readings used in arithmetic, ordering comparisons or sort keys."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    module_scope = _scope_of(tree, _Scope())
    found = set()

    def visit(fn, scope):
        for node in ast.walk(fn):
            if node is not fn and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Add)):
                if _source(node.left, scope) or _source(node.right, scope):
                    found.add((node.lineno, "arithmetic"))
            elif isinstance(node, ast.Compare) and any(isinstance(op, ORDERING) for op in node.ops):
                if any(_source(x, scope) for x in [node.left] + node.comparators):
                    found.add((node.lineno, "ordering comparison"))
            elif isinstance(node, ast.Call) and _dotted(node.func) in ("sorted", "min", "max") \
                    or isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sort":
                for kw in node.keywords:
                    if kw.arg == "key" and any(_source(x, scope) for x in ast.walk(kw.value)):
                        found.add((node.lineno, "sort key"))

    def functions(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = _scope_of(child, scope)
                visit(child, inner)
                functions(child, inner)
            else:
                functions(child, scope)

    visit(tree, module_scope)
    functions(tree, module_scope)
    for line, code in _embedded(tree):  # a script shipped as a string (engine_process's supervisor)
        embedded = ast.parse(code)
        scope = _scope_of(embedded, _Scope())
        before = set(found)
        visit(embedded, scope)
        functions(embedded, scope)
        found = before | set((line + n - 1, what + " (embedded script)") for n, what in found - before)
    return sorted(found)


def _embedded(tree):
    """``(line, source)`` of module-level string constants that are Python programs (with a function)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                and "def " in node.value.value:
            try:
                parsed = ast.parse(node.value.value)
            except SyntaxError:
                continue
            if any(isinstance(n, ast.FunctionDef) for n in parsed.body):
                yield node.value.lineno, node.value.value


def _python_files():
    for dirpath, _dirs, files in os.walk(PLUGINS):
        for fn in sorted(files):
            if fn.endswith(".py"):
                full = os.path.join(dirpath, fn)
                yield os.path.relpath(full, PLUGINS), full


# ---- the scanner itself ----------------------------------------------------------------------------------

def _sites_in(tmp_path, code):
    p = tmp_path / "x.py"
    p.write_text(code)
    return clock_sites(str(p))


def test_the_scanner_sees_each_way_a_wall_reading_is_compared(tmp_path):
    assert _sites_in(tmp_path, "import time\nage = time.time() - 5\n") == [(2, "arithmetic")]
    assert _sites_in(tmp_path, "import os, time\ndef f(p):\n    now = time.time()\n    return now - os.lstat(p).st_mtime\n") \
        == [(4, "arithmetic")]
    assert _sites_in(tmp_path, "import time\ndef f(now=None):\n    now = time.time() if now is None else now\n"
                               "    return now > 3\n") == [(4, "ordering comparison")]
    assert _sites_in(tmp_path, "import time\ndef f(d, now=time.time):\n    return now() - d['started']\n") \
        == [(3, "arithmetic")]
    assert _sites_in(tmp_path, "import time\nclass A:\n    def __init__(self, now=None):\n"
                               "        self.now = time.time() if now is None else now\n"
                               "    def age(self, t):\n        return self.now - t\n") == [(6, "arithmetic")]
    # (an attribute set from the clock in one method and subtracted in another: the pending-age defect's shape)
    assert _sites_in(tmp_path, "import os\ndef f(ps):\n    return sorted(ps, key=lambda p: os.stat(p).st_mtime)\n") \
        == [(3, "sort key")]
    assert _sites_in(tmp_path, "import datetime\nx = datetime.datetime.now() + 1\n") == [(2, "arithmetic")]


def test_the_scanner_leaves_timestamps_for_people_and_identity_checks_alone(tmp_path):
    assert _sites_in(tmp_path, "import time\nd = {'started_at': time.time()}\n") == []
    assert _sites_in(tmp_path, "import os\ndef f(p, k):\n    st = os.lstat(p)\n    return (st.st_ino, st.st_mtime_ns) != k\n") \
        == []
    assert _sites_in(tmp_path, "import time\nt0 = time.monotonic()\nx = time.monotonic() - t0\n") == []


def test_the_old_gc_partial_age_and_prune_order_are_caught(tmp_path):
    """The two defects of this class in staging and caches, as they were written."""
    gc = ("import os, time\ndef gc(full):\n    now = time.time()\n    age = now - os.lstat(full).st_mtime\n"
          "    return age\n")
    assert _sites_in(tmp_path, gc) == [(4, "arithmetic")]


# ---- clocks ------------------------------------------------------------------------------------------

def test_no_wall_clock_reading_is_compared_outside_the_allowed_files():
    problems = []
    for rel, full in _python_files():
        sites = clock_sites(full)
        allowed, _why = CLOCK_ALLOWED.get(rel, (0, None))
        if len(sites) > allowed:
            problems.append("plugins/%s: %s" % (rel, ", ".join("line %d (%s)" % s for s in sites)))
    assert not problems, (
        "a wall-clock reading (time.time(), an mtime, datetime.now()) is subtracted, added, ordered or sorted on; "
        "use common/_clock (Stopwatch/deadline for durations, age() of two times from one clock, order_key over a "
        "publish sequence for order), or, for a reviewed exception, add the file to CLOCK_ALLOWED with why:\n"
        + "\n".join(problems))


def test_staging_and_caches_measure_nothing_on_the_wall_clock():
    """The files of this class are not in the allow-list: their count is 0, not merely at most some number."""
    for rel in ("module_utils/stage/_stage_prune.py", "module_utils/stage/_stage_publish.py",
                "module_utils/stage/_stage_marker.py", "module_utils/stage/_stage.py",
                "module_utils/cache/_kcache.py", "module_utils/cache/_kcache_gc.py",
                "module_utils/cache/_kcache_build.py"):
        assert rel not in CLOCK_ALLOWED
        assert clock_sites(os.path.join(PLUGINS, rel)) == [], rel


def test_the_files_fixed_in_this_class_measure_nothing_on_the_wall_clock():
    for rel in CLOCK_FIXED:
        assert rel not in CLOCK_ALLOWED
        assert clock_sites(os.path.join(PLUGINS, rel)) == [], rel


def test_the_old_supervisor_stop_timeout_is_caught_and_the_monotonic_one_is_not(tmp_path):
    """The supervisor runs as a string embedded in _process.py; the scan reads it as a program."""
    shape = ("SCRIPT = r'''\nimport time\ndef main(stopping, stop_timeout):\n"
             "    stopping['requested'] = time.%s()\n"
             "    return time.%s() - stopping['requested'] > stop_timeout\n'''\n")
    old = _sites_in(tmp_path, shape % ("time", "time"))
    assert old == [(5, "arithmetic (embedded script)")]
    assert _sites_in(tmp_path, shape % ("monotonic", "monotonic")) == []


def test_durations_across_module_runs_go_through_the_host_instant():
    """A benchmark's time since its plan: the plan records ``_clock.host_instant``, the rounds read
    ``_clock.elapsed_since`` (through ``_bench_plan.elapsed``), never ``started_at``."""
    assert _calls(os.path.join(PLUGINS, "modules/benchmark_plan.py"), "_clock.host_instant")
    assert _calls(os.path.join(PLUGINS, "module_utils/bench/_bench_plan.py"), "_clock.elapsed_since")
    assert _calls(os.path.join(PLUGINS, "module_utils/bench/_bench_round.py"), "_bench_plan.elapsed")
    assert _calls(os.path.join(PLUGINS, "module_utils/engine/_diagnose_local.py"), "_clock.process_age")
    assert _calls(os.path.join(PLUGINS, "module_utils/stage/_stage_peer.py"), "_clock.filesystem_now")


def _calls(path, dotted):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _dotted(n.func) == dotted]


def test_retention_orders_by_the_publish_sequence():
    for rel in ("module_utils/stage/_stage_prune.py", "module_utils/cache/_kcache_gc.py"):
        assert _calls(os.path.join(PLUGINS, rel), "_clock.order_key"), rel
    for rel in ("module_utils/stage/_stage_publish.py", "module_utils/cache/_kcache.py"):
        full = os.path.join(PLUGINS, rel)
        assert _calls(full, "_clock.next_sequence") and _calls(full, "_clock.sequence_lock"), rel


# ---- names -------------------------------------------------------------------------------------------

def _imports(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(node.module + "." + a.name for a in node.names)
    return out


def test_only_names_normalises_unicode():
    users = [rel for rel, full in _python_files() if any(m.split(".")[0] == "unicodedata" for m in _imports(full))]
    assert users == ["module_utils/common/_names.py"], (
        "compare names with common/_names.same_name / normal, never with unicodedata directly: %s" % users)


#: files that read pins (``pinned``, ``in_use``) and compare them with names on disk -> how they compare them
PIN_READERS = {
    "module_utils/stage/_stage_prune.py": "_names.same_name / _names.find_spelling",
    "module_utils/cache/_kcache_gc.py": "hex fingerprints (FP_RE: ASCII, one spelling) and paths by device and inode",
}
#: files that only pass pins on, or use the word for something else
PIN_PASSERS = {"modules/model_stage.py", "module_utils/stage/_stage.py", "modules/kernel_cache.py",
               "module_utils/kube/_k8s_upgrade.py",  # records and prints the revisions an upgrade pins; compares none
               "module_utils/kube/_k8s_engine.py"}   # ``pinned``: nodeSelectorTerms of a node affinity, not revisions


def _mentions(path, names):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names or isinstance(node, ast.arg) and node.arg in names:
            return True
    return False


def test_every_file_that_reads_pins_is_listed_and_prune_compares_through_names():
    readers = {rel for rel, full in _python_files() if _mentions(full, {"pinned", "in_use"})}
    assert readers - PIN_PASSERS == set(PIN_READERS), (
        "a new file reads pins: compare them through common/_names (same_name, find_spelling) and list it in "
        "PIN_READERS")
    prune = os.path.join(PLUGINS, "module_utils/stage/_stage_prune.py")
    assert _calls(prune, "_names.same_name") and _calls(prune, "_names.find_spelling")
    gc = os.path.join(PLUGINS, "module_utils/cache/_kcache_gc.py")
    assert _calls(gc, "FP_RE.match")


def test_every_suffix_staging_appends_is_checked_against_name_max():
    """A new suffix constant in stage/ must join the suffixes ``_names.check_component`` checks."""
    checked = set(_stage_layout.DEST_SUFFIXES) | set(_stage_layout.FILE_SUFFIXES)
    constants = {}
    for rel, full in _python_files():
        if not rel.startswith("module_utils/stage/"):
            continue
        with open(full, encoding="utf-8") as f:
            tree = ast.parse(f.read(), full)
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.endswith(("_SUFFIX", "_INFIX")):
                        constants[rel + ":" + t.id] = node.value.value
    assert constants, "the scan found no suffix constants"
    for where, value in sorted(constants.items()):
        assert any(s.startswith(value) for s in checked), "%s = %r is not in DEST_SUFFIXES / FILE_SUFFIXES" % (
            where, value)
    assert _stage_marker.PART_SUFFIX in _stage_layout.FILE_SUFFIXES
    assert max(len(s) for s in _stage_layout.DEST_SUFFIXES) == len(".removing-") + 8


def test_the_source_listing_checks_names_before_the_lock():
    """``stage`` calls the name check before it takes ``DestLock`` (no lock file, no build directory)."""
    path = os.path.join(PLUGINS, "module_utils/stage/_stage.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    stage = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "stage")
    check = min(n.lineno for n in ast.walk(stage) if isinstance(n, ast.Call)
                and _dotted(n.func) == "_stage_layout.check_src_names")
    lock = min(n.lineno for n in ast.walk(stage) if isinstance(n, ast.Call) and _dotted(n.func) == "DestLock")
    assert check < lock
