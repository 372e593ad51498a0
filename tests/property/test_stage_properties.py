"""Property-based harness for model_stage: random source trees, hostile paths, corruption and kills.

After every step the invariants a user relies on are checked:

* the source revisions are byte-for-byte what they were (sources are only read);
* ``dest`` is absent, or byte-identical to exactly one source revision, with a marker that lists exactly its
  files and sizes (and the right sha256 where it records one);
* nothing was written outside ``dest`` (and its ``.partial`` / lock / removal siblings) and the progress file.

Every refusal must be a ``StageError`` or a ``CheckpointError`` (clean errors the module reports with the option
or file named), never another exception.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more
(``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hypothesis import HealthCheck, Phase, event, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors, _stage

# The clean refusals: the module turns each into fail_json naming the option or file (and file=/reason=).
CLEAN = (_stage.StageError, _safetensors.CheckpointError)

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
STEPS = int(os.environ.get("LLMOPS_FUZZ_STEPS", "8"))
# Shrinking a failing stateful case can take minutes; `make fuzz` turns it on, the bounded CI run reports the
# failing case as found.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYCOLL = os.path.join(ROOT, ".build", "pycoll")

# Names a source may hold that sit next to the names staging uses itself.
NEAR_INTERNAL = [_stage.MARKER, _stage.MARKER + ".tmp", "w.safetensors" + _stage.PART_SUFFIX,
                 "x" + _stage.PARTIAL_SUFFIX, "y" + _stage.LOCK_SUFFIX, "SHA256SUMS.bak"]
PLAIN = ["config.json", "tokenizer.json", "model-00001.bin", "model-00002.bin", "sub/a.bin", "sub/deep/b.bin"]

file_names = st.sampled_from(PLAIN + NEAR_INTERNAL)
contents = st.one_of(st.binary(max_size=64), st.integers(0, 300 * 1024).map(os.urandom))
trees = st.dictionaries(file_names, contents, min_size=1, max_size=6)
links = st.lists(st.tuples(st.sampled_from(["ln-in", "sub/ln-in", "ln-out", "ln-dir"]), st.booleans()),
                 max_size=2, unique_by=lambda t: t[0])
verify_modes = st.sampled_from(list(_stage.VERIFY_MODES))

KILL_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
print("go", flush=True)
_stage.stage(sys.argv[2], sys.argv[3], verify=sys.argv[4], progress_file=sys.argv[5], read_streams=2, fsync=False)
"""


def _snapshot(root, skip=()):
    """{relpath: bytes | ('link', target) | 'dir'} of everything under ``root`` except ``skip`` prefixes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for d in sorted(dirnames):
            rel = os.path.normpath(os.path.join(rel_dir, d))
            if any(rel == s or rel.startswith(s) for s in skip):
                continue
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            else:
                out[rel] = "dir"
                keep.append(d)
        dirnames[:] = keep
        for fn in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, fn))
            if any(rel == s or rel.startswith(s) for s in skip):
                continue
            full = os.path.join(dirpath, fn)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            else:
                with open(full, "rb") as f:
                    out[rel] = (f.read(), os.stat(full).st_mode & 0o7777)
    return out


def _files(root):
    """{relpath: bytes} of the regular files a staged dest holds, marker excluded."""
    out = {}
    for dirpath, _dirs, filenames in os.walk(root):
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, root)
            assert not os.path.islink(full), "dest holds a symlink: %s" % rel
            if rel != _stage.MARKER:
                with open(full, "rb") as f:
                    out[rel] = f.read()
    return out


def _expected(src):
    """What a correct staging of ``src`` holds: ``must`` are its regular files; ``may`` are paths through an
    in-tree symlink, which a stager may follow (copying the bytes) or refuse, but never copy from outside."""
    must, may = {}, {}
    real_src = os.path.realpath(src)
    for dirpath, _dirnames, filenames in os.walk(src, followlinks=True):
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, src)
            real = os.path.realpath(full)
            if not real.startswith(real_src + "/") or not os.path.isfile(real):
                continue
            with open(real, "rb") as f:
                (may if _has_link(src, rel) else must)[rel] = f.read()
    return must, may


def _has_link(src, rel):
    cur = src
    for part in rel.split("/"):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            return True
    return False


class StageMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.box = tempfile.mkdtemp(prefix="llmops-fuzz-")
        self.shared = os.path.join(self.box, "shared", "m")
        self.dest = os.path.join(self.box, "nvme", "m", "rev")
        self.progress = os.path.join(self.box, "progress", "m.json")
        os.makedirs(self.shared)
        os.makedirs(os.path.dirname(self.dest))
        os.makedirs(os.path.dirname(self.progress))
        os.makedirs(os.path.join(self.box, "outside"))
        with open(os.path.join(self.box, "outside", "secret"), "wb") as f:
            f.write(b"root-only bytes")
        self.sources = {}        # name -> path
        self.src_snap = {}       # name -> snapshot at creation
        self.allowed = set()     # source revisions dest may equal (a killed run may or may not have published)
        self.may_be_absent = True
        self.mtime = 1_700_000_000_000_000_000
        self.last_error = None
        self.wrong_sums = set()   # sources whose SHA256SUMS does not match their bytes

    def teardown(self):
        shutil.rmtree(self.box, ignore_errors=True)

    # ---- helpers ---------------------------------------------------------------------------------
    def _skip_dest(self):
        rel = os.path.relpath(self.dest, self.box)
        return (rel, rel + _stage.PARTIAL_SUFFIX, rel + _stage.LOCK_SUFFIX, rel + ".removing-",
                os.path.relpath(self.progress, self.box))

    def _outside(self):
        return _snapshot(self.box, skip=self._skip_dest())

    def _stage(self, name, verify, **kw):
        before = self._outside()
        try:
            res = _stage.stage(self.sources[name], self.dest, verify=verify, progress_file=self.progress,
                               read_streams=2, fsync=False, **kw)
        except CLEAN as e:
            assert str(e), "a refusal must say why"
            self.last_error = str(e)
            res = None
        after = self._outside()
        assert before == after, "staging changed files outside dest and the progress file: %s" % sorted(
            k for k in set(before) | set(after) if before.get(k) != after.get(k))
        return res

    def _clean_source(self, name, verify):
        """No symlink, no name next to the internal ones, and a SHA256SUMS for sha256: such a tree must stage."""
        snap = self.src_snap[name]
        if verify == "sha256" and ("SHA256SUMS" not in snap or name in self.wrong_sums):
            return False
        return not any(isinstance(v, tuple) and v[0] == "link" for v in snap.values()) and not any(
            os.path.basename(p) in NEAR_INTERNAL or p.endswith(_stage.PART_SUFFIX) for p in snap)

    def _matching(self):
        """Source revisions whose bytes dest holds exactly."""
        got = _files(self.dest)
        out = []
        for name in sorted(self.sources):
            must, may = _expected(self.sources[name])
            if all(got.get(k) == v for k, v in must.items()) and \
                    all(k in must or may.get(k) == v for k, v in got.items()):
                out.append(name)
        return out

    # ---- rules ----------------------------------------------------------------------------------
    @precondition(lambda self: len(self.sources) < 3)
    @rule(tree=trees, extra_links=links, same_mtime=st.booleans(), sums=st.sampled_from(["none", "good", "wrong"]))
    def add_source(self, tree, extra_links, same_mtime, sums):
        name = "r%d" % len(self.sources)
        path = os.path.join(self.shared, name)
        for rel, data in tree.items():
            full = os.path.join(path, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if os.path.isdir(full):
                continue
            with open(full, "wb") as f:
                f.write(data)
            if same_mtime:  # revisions with identical shapes and mtimes must still not share files
                os.utime(full, ns=(self.mtime, self.mtime))
        for ln, absolute in extra_links:
            full = os.path.join(path, ln)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if os.path.lexists(full):
                continue
            if ln.endswith("ln-out"):
                target = os.path.join(self.box, "outside", "secret")
            elif ln.endswith("ln-dir"):
                os.makedirs(os.path.join(path, "sub"), exist_ok=True)
                target = os.path.join(path, "sub")
            else:
                target = os.path.join(path, sorted(tree)[0])
            os.symlink(target if absolute else os.path.relpath(target, os.path.dirname(full)), full)
        if sums != "none":  # the revision's own sha256sum list, which verify: sha256 checks the copy against
            listing = sorted(_expected(path)[0].items())
            with open(os.path.join(path, "SHA256SUMS"), "w") as f:
                for rel, data in listing:
                    digest = hashlib.sha256(data + (b"x" if sums == "wrong" else b"")).hexdigest()
                    f.write("%s  %s\n" % (digest, rel))
            if sums == "wrong":
                self.wrong_sums.add(name)
        self.sources[name] = path
        self.src_snap[name] = _snapshot(path)

    @precondition(lambda self: self.sources)
    @rule(data=st.data(), verify=verify_modes, direct_io=st.booleans())
    def stage(self, data, verify, direct_io):
        name = data.draw(st.sampled_from(sorted(self.sources)))
        res = self._stage(name, verify, direct_io=direct_io)
        if res is not None:
            self.allowed, self.may_be_absent = {name}, False
        else:
            assert not self._clean_source(name, verify), "a clean source tree was refused: %s" % self.last_error

    @precondition(lambda self: self.allowed)
    @rule(how=st.sampled_from(["truncate", "rewrite_same_size", "delete", "add"]), verify=verify_modes,
          data=st.data())
    def corrupt_then_restage(self, how, verify, data):
        current = self._matching() if os.path.isdir(self.dest) else []
        files = sorted(_files(self.dest)) if current else []
        if not files:
            return
        rel = data.draw(st.sampled_from(files))
        full = os.path.join(self.dest, rel)
        st_before = os.stat(full)
        if how == "truncate":
            with open(full, "r+b") as f:
                f.truncate(max(st_before.st_size - 1, 0))
            if st_before.st_size == 0:
                with open(full, "ab") as f:
                    f.write(b"!")
        elif how == "rewrite_same_size":
            with open(full, "r+b") as f:
                old = f.read()
                f.seek(0)
                f.write(bytes(b ^ 0xFF for b in old) if old else b"")
            if not st_before.st_size:
                with open(full, "ab") as f:
                    f.write(b"!")
            os.utime(full, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))  # hide it from size+mtime
        elif how == "delete":
            os.unlink(full)
        else:
            with open(os.path.join(self.dest, "stray.bin"), "wb") as f:
                f.write(b"not from the source")
        if verify == "sha256" and ("SHA256SUMS" not in self.src_snap[current[0]] or current[0] in self.wrong_sums):
            verify = "headers"  # sha256 needs the revision's own (right) checksum list
        res = self._stage(current[0], verify)
        if res is not None:
            self.allowed, self.may_be_absent = {current[0]}, False
        assert res is not None, "re-staging a published revision after %s was refused: %s" % (how, self.last_error)

    @precondition(lambda self: self.sources)
    @rule(data=st.data(), delay=st.floats(0.0, 0.6), verify=verify_modes)
    def kill_mid_copy(self, data, delay, verify):
        name = data.draw(st.sampled_from(sorted(self.sources)))
        before = self._outside()
        p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, PYCOLL, self.sources[name], self.dest, verify,
                              self.progress], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        p.stdout.readline()
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert before == self._outside(), "a killed run changed files outside dest"
        self.allowed.add(name)

    @precondition(lambda self: self.sources)
    @rule(data=st.data(), kind=st.sampled_from(["src_is_dest_partial", "src_below_partial", "dest_link_into_src",
                                                "progress_in_src", "progress_in_dest", "checksums_in_dest"]))
    def overlapping_paths_are_refused(self, data, kind):
        name = data.draw(st.sampled_from(sorted(self.sources)))
        src = self.sources[name]
        dest = self.dest
        progress = self.progress
        checksums = None
        made = []
        other = os.path.join(self.box, "nvme", "m", "other")
        if kind == "src_is_dest_partial":
            # the source is a directory named like dest's in-flight copy, next to dest
            shutil.copytree(src, other + _stage.PARTIAL_SUFFIX, symlinks=True)
            made.append(other + _stage.PARTIAL_SUFFIX)
            src, dest = other + _stage.PARTIAL_SUFFIX, other
        elif kind == "src_below_partial":
            inner = os.path.join(other + _stage.PARTIAL_SUFFIX, "nested-src")
            shutil.copytree(src, inner, symlinks=True)
            made.append(other + _stage.PARTIAL_SUFFIX)
            src, dest = inner, other
        elif kind == "dest_link_into_src":
            os.symlink(src, other)
            made.append(other)
            dest = other
        elif kind == "progress_in_src":
            progress = os.path.join(src, "progress.json")
        elif kind == "progress_in_dest":
            dest, progress = other, os.path.join(other, "progress.json")
        else:
            # a checksum list kept in dest's working directory, which staging cleans
            os.makedirs(other + _stage.PARTIAL_SUFFIX)
            made.append(other + _stage.PARTIAL_SUFFIX)
            checksums = os.path.join(other + _stage.PARTIAL_SUFFIX, "SHA256SUMS")
            with open(checksums, "w") as f:
                for rel, data in sorted(_expected(src)[0].items()):
                    f.write("%s  %s\n" % (hashlib.sha256(data).hexdigest(), rel))
            dest = other
        checksums_before = _snapshot(os.path.dirname(checksums)) if checksums else None
        src_before = _snapshot(src)
        try:
            _stage.stage(src, dest, verify="sha256" if checksums else "headers", checksums=checksums,
                         progress_file=progress, read_streams=2, fsync=False)
            refused = False
        except CLEAN:
            refused = True
        assert refused, "%s was not refused" % kind
        assert _snapshot(src) == src_before, "%s changed the source" % kind
        if checksums:
            assert _snapshot(os.path.dirname(checksums)) == checksums_before, "the checksum list was touched"
        for m in made:
            if os.path.islink(m) or os.path.isfile(m):
                os.unlink(m)
            else:
                shutil.rmtree(m, ignore_errors=True)
        for leftover in (other, other + _stage.LOCK_SUFFIX, other + _stage.PARTIAL_SUFFIX):
            if os.path.islink(leftover) or os.path.isfile(leftover):
                os.unlink(leftover)
            elif os.path.isdir(leftover):
                shutil.rmtree(leftover)

    @precondition(lambda self: self.allowed)
    @rule()
    def remove(self):
        try:
            _stage.remove(self.dest)
        except CLEAN as e:
            assert str(e)
            return
        assert not os.path.exists(self.dest)
        self.allowed, self.may_be_absent = set(), True

    # ---- invariants -----------------------------------------------------------------------------
    @invariant()
    def sources_are_unchanged(self):
        for name, snap in self.src_snap.items():
            assert _snapshot(self.sources[name]) == snap, "source %s changed" % name

    @invariant()
    def dest_is_absent_or_one_revision_with_a_matching_marker(self):
        if not os.path.lexists(self.dest):
            assert self.may_be_absent, "the published revision vanished"
            return
        assert not os.path.islink(self.dest)
        got = _files(self.dest)
        with open(os.path.join(self.dest, _stage.MARKER), encoding="utf-8") as f:
            marker = json.load(f)
        listed = {e["path"]: e for e in marker["files"]}
        assert sorted(listed) == sorted(got), "marker lists other files than dest holds"
        for rel, data in got.items():
            assert listed[rel]["size"] == len(data)
            if listed[rel].get("sha256"):
                assert listed[rel]["sha256"] == hashlib.sha256(data).hexdigest()
        matches = self._matching()
        assert set(matches) & self.allowed, "dest matches %s, expected one of %s" % (matches, sorted(self.allowed))
        if marker.get("source"):
            assert any(os.path.realpath(marker["source"]) == os.path.realpath(self.sources[n]) for n in matches), \
                "marker names a source whose bytes dest does not hold"


StageMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True, database=None, phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
test_model_stage_properties = StageMachine.TestCase


# ---- clocks and names (docs/reliability.md, "clocks" and "names") -------------------------------------------
# Each property stages real revisions with the module's code; a failing example is a concrete tree to replay.

NAME_EXAMPLES = max(10, EXAMPLES // 2)
YEARS = 365 * 86400.0


def _write_src(root, name, files):
    src = os.path.join(root, "shared", name)
    os.makedirs(src)
    for rel, data in files.items():
        with open(os.path.join(src, rel), "wb") as f:
            f.write(data)
    return src


def _stage_rev(root, name, **kw):
    src = os.path.join(root, "shared", name)
    if not os.path.isdir(src):
        _write_src(root, name, {"config.json": name.encode("utf-8")})
    return _stage.stage(src, os.path.join(root, "nvme", name), verify="size", fsync=False, **kw)


def _staged(root):
    return sorted(n for n in os.listdir(os.path.join(root, "nvme"))
                  if not n.endswith((_stage.LOCK_SUFFIX, _stage.PARTIAL_SUFFIX)))


@settings(max_examples=NAME_EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES)
@given(offsets=st.lists(st.floats(-20 * YEARS, 20 * YEARS, allow_nan=False), min_size=2, max_size=5),
       mtimes=st.lists(st.integers(1, 4_000_000_000), min_size=5, max_size=5),
       keep=st.integers(1, 4))
def test_clock_skew_never_changes_which_revisions_retention_keeps(offsets, mtimes, keep):
    """Whatever the clock said while each revision was staged (up to 20 years either way) and whatever mtimes the
    directories carry, ``keep_revisions`` keeps the last ``keep`` staged: the publish order, never a clock."""
    from unittest import mock
    real = time.time
    root = tempfile.mkdtemp(prefix="llmops-clock-")
    try:
        names = ["r%d" % i for i in range(len(offsets))]
        for i, (name, offset) in enumerate(zip(names, offsets)):
            with mock.patch.object(time, "time", lambda offset=offset: real() + offset):
                last = i == len(names) - 1
                res = _stage_rev(root, name, keep_revisions=keep if last else 0)
            for j, other in enumerate(_staged(root)):
                os.utime(os.path.join(root, "nvme", other), (mtimes[j], mtimes[j]))
        assert _staged(root) == sorted(names[-keep:])
        assert sorted(res["pruned"]) == sorted(os.path.join(root, "nvme", n) for n in names[:-keep])
    finally:
        shutil.rmtree(root, ignore_errors=True)


# letters whose NFC and NFD spellings differ, and plain ones (NFKC of each equals its NFC: no compatibility forms)
ACCENTED = "éèêëàâäçñüöåøÅÉÈÇÑÖ"
PLAIN_LETTERS = "abcxyz019-_"


@settings(max_examples=NAME_EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES)
@given(text=st.text(alphabet=ACCENTED + PLAIN_LETTERS, min_size=1, max_size=12).filter(lambda t: any(c in ACCENTED for c in t)),
       stored_form=st.sampled_from(["NFC", "NFD"]), typed_form=st.sampled_from(["NFC", "NFD"]),
       as_path=st.booleans())
def test_every_unicode_spelling_of_a_pin_protects_the_same_directory(text, stored_form, typed_form, as_path):
    """A pin typed in either normalisation form (by name or by path) protects the revision stored in either one,
    and is never reported unmatched."""
    import unicodedata
    stored = unicodedata.normalize(stored_form, "rev-" + text)
    typed = unicodedata.normalize(typed_form, "rev-" + text)
    root = tempfile.mkdtemp(prefix="llmops-names-")
    try:
        _stage_rev(root, stored)
        _stage_rev(root, "zz-newer")
        pin = os.path.join(root, "nvme", typed) if as_path else typed
        res = _stage_rev(root, "zz-newest", keep_revisions=1, pinned=[pin])
        assert stored in _staged(root), "the pinned revision was pruned"
        assert res["pruned"] == [os.path.join(root, "nvme", "zz-newer")]
        assert res["unmatched_pins"] == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _near_limit(ascii_part, wide, limit=255):
    name = "é" * wide + "n" * ascii_part
    while len(name.encode("utf-8")) > limit:  # a name the filesystem itself can hold
        name = name[1:]
    return name


@settings(max_examples=NAME_EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES)
@given(ascii_part=st.integers(200, 258), wide=st.integers(0, 20), dest_part=st.integers(220, 255),
       data=st.binary(max_size=64))
def test_names_near_the_limit_are_refused_up_front_or_staged_never_half_published(ascii_part, wide, dest_part, data):
    """A source name near NAME_MAX is staged when it fits with ``.llmops-part``, and dest's name when it fits with
    ``.removing-XXXXXXXX``; otherwise the run is refused before anything exists beside dest: never a half-copied
    build directory, a lock left behind or a traceback."""
    name = _near_limit(ascii_part, wide)
    dest_name = _near_limit(dest_part, 0)
    fits = len(name.encode("utf-8")) + len(_stage.PART_SUFFIX) <= 255 and len(dest_name) + 18 <= 255
    root = tempfile.mkdtemp(prefix="llmops-len-")
    nvme = os.path.join(root, "nvme")
    try:
        src = _write_src(root, "r", {name: data, "config.json": b"{}"})
        try:
            _stage.stage(src, os.path.join(nvme, dest_name), verify="size", fsync=False)
        except _stage.StageError as e:
            assert not fits and e.reason == "name_too_long", str(e)
            assert not os.path.exists(nvme) or os.listdir(nvme) == []
            event("refused up front")
            return
        assert fits, "a name over NAME_MAX with its suffix was accepted"
        with open(os.path.join(nvme, dest_name, name), "rb") as f:
            assert f.read() == data
        with open(os.path.join(nvme, dest_name, _stage.MARKER)) as f:
            assert sorted(e["path"] for e in json.load(f)["files"]) == sorted([name, "config.json"])
        assert sorted(os.listdir(nvme)) == sorted([dest_name, dest_name + _stage.LOCK_SUFFIX])
        event("staged")
    finally:
        shutil.rmtree(root, ignore_errors=True)
