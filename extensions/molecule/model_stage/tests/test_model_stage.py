"""model_stage: the staged revision holds the source's bytes, its marker records each copy, nothing half-done."""
from __future__ import annotations

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker


@pytest.fixture
def paths(tree, root):
    rev, dummy = tree.only_entry(root + "/shared/models/tiny-llama", "source revision")
    return rev, "%s/shared/models/tiny-llama/%s" % (root, rev), "%s/nvme/models/tiny-llama/%s" % (root, rev)


def test_staged_bytes_and_modes_equal_the_source(tree, paths):
    rev, src, dest = paths
    src_sums, dest_sums = tree.digests(src), tree.digests(dest)
    assert "SHA256SUMS" in src_sums and len(src_sums) > 3
    assert sorted(dest_sums) == sorted(list(src_sums) + [_stage_marker.MARKER])
    assert dict((n, d) for n, d in dest_sums.items() if n != _stage_marker.MARKER) == src_sums
    src_stats, dest_stats = tree.stats(src), tree.stats(dest)
    for name in src_sums:
        assert dest_stats[name][2] == src_stats[name][2] | 0o400, "%s: mode %o, the source's %o" % (
            name, dest_stats[name][2], src_stats[name][2])
    # the source still matches its own manifest: it was only read
    assert tree.sha256sums(src + "/SHA256SUMS") == dict((n, d) for n, d in src_sums.items() if n != "SHA256SUMS")


def test_the_marker_records_every_copy_and_its_source(host, tree, paths):
    rev, src, dest = paths
    marker_path = "%s/%s" % (dest, _stage_marker.MARKER)
    assert host.file(marker_path).mode == 0o644
    # the collection's own reader trusts it (the next run keeps the copy instead of staging it again)
    assert _stage_marker.read_marker(dest).kind == "ok"
    marker = tree.json(marker_path)
    assert marker["format"] == _stage_marker.MARKER_FORMAT and marker["verify"] == "sha256"
    assert marker["source"] == host.check_output("realpath %s", src)
    sums = tree.sha256sums(src + "/SHA256SUMS")
    src_stats, dest_stats = tree.stats(src), tree.stats(dest)
    files = dict((f["path"], f) for f in marker["files"])
    assert sorted(files) == sorted(src_stats)
    for name, rec in files.items():
        s_ino, s_size, dummy, s_dev = src_stats[name]
        d_ino, d_size = dest_stats[name][:2]
        assert rec["verify"] == "sha256" and rec["size"] == s_size, name
        assert (rec["src"]["dev"], rec["src"]["ino"]) == (s_dev, s_ino), name
        assert (rec["copy"]["ino"], rec["copy"]["size"]) == (d_ino, d_size), name
        if name in sums:
            assert rec["sha256"] == sums[name], name
        if name.endswith(".safetensors"):
            assert len(rec["header_sha256"]) == 64, name


def test_nothing_half_copied_is_left_and_only_this_revision_is_published(tree, root, paths):
    rev, src, dest = paths
    names = tree.listdir(root + "/nvme/models/tiny-llama")
    assert not [n for n in names if n.endswith(".partial") or ".removing-" in n], names
    assert [n for n in names if not n.endswith(".lock")] == [rev], names


def test_progress_and_metrics_describe_the_finished_copy(host, tree, root, paths):
    rev, src, dest = paths
    total = sum(s[1] for s in tree.stats(src).values())
    progress = tree.json(root + "/stage-progress/tiny-llama.json")
    assert progress["bytes_done"] == progress["bytes_total"] == total, progress
    prom = host.file(root + "/textfile/llmops_model_stage.prom")
    assert prom.mode == 0o644
    labels = 'model="tiny-llama",revision="%s",verify="sha256"' % rev
    samples = dict(line.rsplit(" ", 1) for line in prom.content_string.splitlines() if line and line[0] != "#")
    assert int(samples["llmops_model_stage_bytes{%s}" % labels]) == total
    assert int(samples["llmops_model_stage_bytes_copied{%s}" % labels]) == total
