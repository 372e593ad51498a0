"""kernel_cache: one published fingerprint directory whose manifest matches its files, built once, and the
engine's own writable copy relocated to its mount path."""
from __future__ import annotations

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache

MOUNT = "/cache"  # kernel_cache_mount_path in converge.yml


@pytest.fixture
def cache(tree, root):
    base = root + "/nvme/kernel-cache/vllm"
    fp, hidden = tree.only_entry(base, "published fingerprint")
    return base, fp, hidden


def test_the_published_directory_matches_its_manifest(host, tree, cache):
    base, fp, dummy = cache
    published = "%s/%s" % (base, fp)
    manifest = tree.json(published + "/" + _kcache.MANIFEST)
    assert (manifest["schema"], manifest["engine"], manifest["fingerprint"]) == (_kcache.MANIFEST_SCHEMA, "vllm", fp)
    assert manifest["components"]["model_revision"] == "rev1"
    files = dict((f["path"], f) for f in manifest["files"])
    assert sorted(files) == ["triton/KEY/__grp__k.json", "triton/KEY/k.cubin"]
    assert manifest["file_count"] == 2
    digests, stats = tree.digests(published), tree.stats(published)
    cubin = files["triton/KEY/k.cubin"]
    assert (cubin["sha256"], cubin["size"]) == (digests["triton/KEY/k.cubin"], stats["triton/KEY/k.cubin"][1])
    assert files["triton/KEY/__grp__k.json"]["size"] == -1  # group files are hashed in a location-free form
    # the collection's own check, the one every engine start runs, trusts it
    res = _kcache.verify_dir(published, fp, manifest["components"])
    assert res["status"] == "ok", res["problems"]


def test_triton_groups_name_their_own_directory(tree, cache):
    base, fp, dummy = cache
    published = "%s/%s/triton/KEY" % (base, fp)
    assert tree.json(published + "/__grp__k.json")["child_paths"] == {"k.cubin": published + "/k.cubin"}


def test_the_engine_copy_is_its_own_and_points_at_the_mount_path(tree, cache):
    base, fp, hidden = cache
    copy = "%s/.run/%s-engine" % (base, fp)
    assert tree.json(copy + "/triton/KEY/__grp__k.json")["child_paths"] == {"k.cubin": MOUNT + "/triton/KEY/k.cubin"}
    published, mine = tree.stats("%s/%s" % (base, fp)), tree.stats(copy)
    assert mine["triton/KEY/k.cubin"][0] != published["triton/KEY/k.cubin"][0], "the copy shares an inode"
    assert tree.digests(copy)["triton/KEY/k.cubin"] == tree.digests("%s/%s" % (base, fp))["triton/KEY/k.cubin"]


def test_built_once_and_nothing_left_half_done(host, tree, root, cache):
    base, fp, hidden = cache
    # converge built it, the idempotence run verified and reused it
    assert host.file(root + "/warmup-runs").content_string == "x"
    # no .partial-* build directory left, only the engine copies, the locks and the logs
    assert set(hidden) <= {_kcache.RUNS, ".locks", ".logs"}, hidden
    assert tree.listdir(base + "/" + _kcache.RUNS) == [fp + "-engine"]
    quarantine = root + "/nvme/kernel-cache/" + _kcache.QUARANTINE
    assert not host.file(quarantine).exists or tree.listdir(quarantine) == []
