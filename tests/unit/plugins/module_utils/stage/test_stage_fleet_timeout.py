"""A stager that finds every fleet read slot taken fails cleanly after lock_timeout (never waits forever)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots, _stage


def _revision(root):
    src = root / "shared" / "m" / "rev"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.bin").write_bytes(os.urandom(4096))
    return src


def test_all_fleet_slots_held_fails_after_lock_timeout_naming_the_holders(tmp_path):
    src = _revision(tmp_path)
    slots_dir = tmp_path / "fleet"
    holder = _fleet_slots.FleetSlots(str(slots_dir), 1, host_id="gpu-b", host_max=1)
    holder.open()
    lease = holder.acquire()
    try:
        with pytest.raises(_stage.StageError) as e:
            _stage.stage(str(src), str(tmp_path / "nvme" / "m" / "rev"), fleet_slots_dir=str(slots_dir),
                         fleet_read_streams=1, fleet_host_id="gpu-a", lock_timeout=1, fsync=False)
        assert "fleet_slots_dir" in str(e.value) and "gpu-b" in str(e.value)
        assert e.value.reason == "slot_timeout"
        assert not (tmp_path / "nvme" / "m" / "rev").exists()
    finally:
        holder.release(lease)
        holder.close()


def test_module_result_carries_file_and_reason(tmp_path, run_module):
    src = _revision(tmp_path)
    slots_dir = tmp_path / "fleet"
    holder = _fleet_slots.FleetSlots(str(slots_dir), 1, host_id="gpu-b", host_max=1)
    holder.open()
    lease = holder.acquire()
    try:
        from ansible_collections.llmops.serving.plugins.modules import model_stage
        res = run_module(model_stage, {
            "src": str(src), "dest": str(tmp_path / "nvme" / "m" / "rev"), "fleet_slots_dir": str(slots_dir),
            "fleet_read_streams": 1, "fleet_host_id": "gpu-a", "lock_timeout": 1, "fsync": False})
        assert res.get("failed"), res
        assert res["reason"] == "slot_timeout" and res["file"], res
        assert "Traceback" not in res["msg"]
    finally:
        holder.release(lease)
        holder.close()
