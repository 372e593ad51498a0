"""preflight: the node facts it published describe this host (GPUs, disks, RDMA, the engine's imports)."""
from __future__ import annotations

import os

import pytest

MODULES = ("numpy", "safetensors", "tokenizers")  # preflight_engine_modules in converge.yml


@pytest.fixture
def node(tree, root):
    return tree.json(root + "/preflight_node.json")


def test_gpu_facts_match_nvidia_smi(host, node):
    if host.exists("nvidia-smi"):
        listed = [line for line in host.check_output("nvidia-smi -L").splitlines() if line.startswith("GPU ")]
        assert node["gpu"]["mode"] == "gpu" and node["gpu"]["count"] == len(listed)
    else:
        assert node["gpu"]["mode"] == "cpu-only" and node["gpu"]["count"] == 0
        assert "nvidia-smi" in node["gpu"]["reason"]


def test_disk_facts_are_the_filesystems_of_the_paths(host, node, root):
    disk = dict((d["path"], d) for d in node["disk"])
    assert sorted(disk) == [root + "/nvme/models", root + "/shared"]
    assert disk[root + "/shared"]["measured_at"] == root + "/shared"
    # a path that does not exist yet is measured at its nearest existing parent
    assert not host.file(root + "/nvme").exists
    assert disk[root + "/nvme/models"]["measured_at"] == root
    for d in disk.values():
        # blocks, free blocks, blocks available to unprivileged users, block size
        blocks, bfree, bavail, bsize = (int(v) for v in host.check_output(
            "stat -f -c '%%b %%f %%a %%S' %s", d["measured_at"]).split())
        assert d["total_bytes"] == blocks * bsize
        # the space the engine's user can write, not counting reserved blocks; other writers move it meanwhile,
        # so it is compared as "nearer to available than to free" plus a bound of 5 % of the filesystem
        free, avail = bfree * bsize, bavail * bsize
        assert abs(d["free_bytes"] - avail) <= blocks * bsize // 20, (d, avail)
        assert abs(d["free_bytes"] - avail) <= abs(d["free_bytes"] - free), (d, avail, free)
        assert d["free_bytes"] >= 10485760  # preflight_min_free_bytes passed


def test_rdma_facts_match_sysfs(host, node):
    ib = host.file("/sys/class/infiniband")
    has_hca = ib.exists and bool(ib.listdir())
    assert node["rdma"]["present"] == has_hca
    assert bool(node["rdma"]["devices"]) == has_hca


def test_engine_runtime_versions_are_what_its_python_imports(host, node):
    rt = node["engine_runtime"]
    assert rt["importable"] is True
    assert host.file(rt["python"]).exists
    for name in MODULES:
        version = host.check_output("%s -c 'import %s; print(%s.__version__)'", rt["python"], name, name)
        assert rt["modules"][name] == {"importable": True, "version": version}, name
    assert os.path.realpath(rt["python"]) == os.path.realpath(host.check_output("command -v python"))
