"""sysfs layouts seen on real hosts (docs/rdma-hardware.md), beside the ABI-built fixtures.

A single-GPU H200 VM (inventoried with benchmarks/rdma_inventory.py): ``/sys/class/infiniband`` exists and is
empty, ``/dev/infiniband`` holds only ``rdma_cm`` (the rdma_ucm/rdma_cm module is loaded, no HCA is bound).
The kernel creates the class directory when ib_core loads, before any device registers
(Documentation/ABI/stable/sysfs-class-infiniband), so "present but empty" is a layout of its own.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.modules import preflight_facts, rdma_counters


def _empty_class(tmp_path):
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)
    return str(tmp_path / "sys")


def test_empty_class_dir_is_no_rdma_and_says_empty(run_module, tmp_path):
    root = _empty_class(tmp_path)
    snap = run_module(rdma_counters, {"sysfs_root": root})
    assert snap["present"] is False and snap["snapshot"]["ports"] == {}
    assert "no RDMA devices" in snap["reason"] and "is empty" in snap["reason"]


def test_empty_class_dir_tcp_control_passes_and_rdma_expectation_fails(run_module, tmp_path):
    root = _empty_class(tmp_path)
    before = run_module(rdma_counters, {"sysfs_root": root})
    tcp = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp"})
    assert not tcp.get("failed"), tcp["msg"]
    assert "no RDMA port could carry the transfer" in tcp["msg"]
    rdma = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "rdma"})
    assert rdma.get("failed") and rdma["msg"].startswith("expect rdma: FAIL") and "is empty" in rdma["msg"]


def test_preflight_reports_the_empty_class_dir(run_module, tmp_path):
    root = _empty_class(tmp_path)
    r = run_module(preflight_facts, {"sysfs_root": root, "nvidia_smi": str(tmp_path / "absent-nvidia-smi"),
                                     "paths": [str(tmp_path)]})
    assert r["rdma"]["present"] is False and "is empty" in r["rdma"]["reason"], r["rdma"]
