"""Property-based harness for kernel caches captured from an engine's first start.

Invariants a user relies on, for any set of files an engine compiles into its per-start directory (any cache kind,
any depth, any bytes, Triton scratch directories among them), published by any number of publishers in any order:

* exactly one publish per fingerprint per store: the first publisher publishes, every later one finds it published
  (``hit``) and publishes nothing; the publish sequence is 1;
* the published directory verifies with no extra file, lists exactly the compiled files that are not a compiler's
  scratch output, each with its sha256, and holds byte for byte what the first publisher's engine wrote;
* a publisher whose components differ from the capture's is refused and publishes nothing;
* the first publisher's per-start directory is then its checkout of the published cache (``ready``, or a fresh
  copy when scratch output lies beside it), equal to the published files.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import hashlib
import os
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build, _kcache_capture

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + (
    [Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

FP = "5a5a5a5a5a5a5a5a"
COMPONENTS = {"engine": "sglang", "engine_version": "0.5.16", "tp": 8}
NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..") and not n.startswith("tmp.pid_"))
REL = st.tuples(st.sampled_from(sorted(_kcache.KINDS["sglang"])), st.lists(NAME, min_size=0, max_size=2).map(tuple),
                NAME, st.booleans())
FILES = st.dictionaries(REL, st.binary(max_size=64), min_size=0, max_size=8)


def _write(base, files):
    """The engine's compile: each file under its cache kind, some inside a Triton scratch directory."""
    wrote = {}
    for (kind, dirs, name, scratch), data in files.items():
        parts = [kind] + list(dirs) + (["tmp.pid_7_x"] if scratch else [])
        d = os.path.join(base, *parts)
        if os.path.isfile(d) or any(os.path.isfile(os.path.join(base, *parts[:i])) for i in range(1, len(parts))):
            continue  # a directory name that is already a file: the engine could not have written both
        os.makedirs(d, exist_ok=True)
        full = os.path.join(d, name)
        if os.path.isdir(full):
            continue
        with open(full, "wb") as f:
            f.write(data)
        wrote[os.path.relpath(full, base)] = (data, scratch)
    return wrote


@SETTINGS
@given(files=FILES, publishers=st.integers(min_value=1, max_value=3), order=st.randoms(use_true_random=False),
       mismatched=st.booleans())
def test_one_publish_per_fingerprint_of_exactly_what_was_compiled(files, publishers, order, mismatched):
    with tempfile.TemporaryDirectory() as tmp:
        root, proc = os.path.join(tmp, "kc"), os.path.join(tmp, "proc")
        instances = ["engine-%d" % i for i in range(publishers)]
        wrote = {}
        for i in instances:
            rd = _kcache_capture.prepare(root, "sglang", FP, COMPONENTS, i, proc_root=proc)["engine_dir"]
            wrote[i] = _write(rd, files)
        if mismatched:
            with pytest.raises(_kcache.KCacheError, match="components differ"):
                _kcache_capture.publish_capture(root, "sglang", FP, dict(COMPONENTS, tp=4), instances[0],
                                                proc_root=proc)
            assert not os.path.exists(_kcache.fingerprint_dir(root, "sglang", FP))
        order.shuffle(instances)
        statuses = [_kcache_capture.publish_capture(root, "sglang", FP, COMPONENTS, i, proc_root=proc)["status"]
                    for i in instances]
        kept = dict((rel, data) for rel, (data, scratch) in wrote[instances[0]].items() if not scratch)
        final = _kcache.fingerprint_dir(root, "sglang", FP)
        if not kept:
            assert statuses == ["empty"] * publishers and not os.path.exists(final)
            return
        assert statuses == ["published"] + ["hit"] * (publishers - 1)
        assert _kcache.verify_dir(final, FP, COMPONENTS, allow_extra=False)["ok"]
        man = _kcache.read_manifest(final)
        assert man["sequence"] == 1
        assert dict((e["path"], e["sha256"]) for e in man["files"]) == dict(
            (rel, hashlib.sha256(data).hexdigest()) for rel, data in kept.items())
        for rel, data in kept.items():
            with open(os.path.join(final, rel), "rb") as f:
                assert f.read() == data
        # the first publisher's directory is its checkout; scratch output left beside it makes the next checkout
        # (no process using it) a fresh copy, equal to the published files either way
        scratch = any(s for _d, s in wrote[instances[0]].values())
        co = _kcache_build.checkout(root, "sglang", FP, COMPONENTS, instances[0], proc_root=proc)
        assert co["status"] == ("copied" if scratch else "ready")
        rd = _kcache.run_dir(root, "sglang", FP, instances[0])
        entries = _kcache.manifest_entries(man)
        assert _kcache_build.compare_to_manifest(rd, entries) == {"new_files": [], "missing_files": []}
