"""serving_record: what a local engine was proven to serve, trusted only while that same engine runs.

An upgrade restores exactly A when B fails; these tests pin down when the record lets it, and that every refusal
names its own reason."""
from __future__ import annotations

import json
import os

from ansible_collections.llmops.serving.plugins.modules import serving_record

MODEL = "/var/tmp/llmops/nvme/models/tiny-llama/8f94f6f0fade"


def _args(tmp_path, **kw):
    return dict({"run_dir": str(tmp_path), "name": "engine", "spec_hash": "abc123"}, **kw)


def test_present_records_path_model_revision_and_spec(run_module, tmp_path):
    r = run_module(serving_record, _args(tmp_path, state="present", model_path=MODEL + "/"))
    assert r["changed"], r
    with open(tmp_path / "engine.serving.json") as f:
        assert json.load(f) == {"model_path": MODEL, "model": "tiny-llama", "revision": "8f94f6f0fade",
                                "spec_hash": "abc123"}
    again = run_module(serving_record, _args(tmp_path, state="present", model_path=MODEL))
    assert not again["changed"]


def test_check_mode_writes_nothing(run_module, tmp_path):
    r = run_module(serving_record, _args(tmp_path, state="present", model_path=MODEL), check_mode=True)
    assert r["changed"] and not os.path.exists(tmp_path / "engine.serving.json")


def test_read_returns_the_record_of_the_running_engine(run_module, tmp_path):
    run_module(serving_record, _args(tmp_path, state="present", model_path=MODEL))
    r = run_module(serving_record, _args(tmp_path))
    assert not r.get("failed") and not r["changed"]
    assert r["record"]["revision"] == "8f94f6f0fade" and r["record"]["model_path"] == MODEL


def test_no_record_is_refused_with_its_reason(run_module, tmp_path):
    r = run_module(serving_record, _args(tmp_path))
    assert r["failed"] and r["reason"] == "no_record"
    assert "site.yml" in r["msg"]


def test_an_engine_restarted_by_other_means_is_not_the_recorded_one(run_module, tmp_path):
    run_module(serving_record, _args(tmp_path, state="present", model_path=MODEL))
    r = run_module(serving_record, _args(tmp_path, spec_hash="other"))
    assert r["failed"] and r["reason"] == "record_mismatch"
    assert "abc123" in r["msg"] and "other" in r["msg"]


def test_a_malformed_or_hostile_record_is_refused_not_trusted(run_module, tmp_path):
    path = tmp_path / "engine.serving.json"
    for content in ("[1, 2]", '{"model_path": 5}', "{not json", json.dumps({"model_path": MODEL, "model": "m",
                                                                           "revision": "", "spec_hash": "abc123"})):
        path.write_text(content)
        r = run_module(serving_record, _args(tmp_path))
        assert r["failed"] and r["reason"] == "bad_record", content
    path.unlink()
    os.symlink("/etc/hostname", path)
    r = run_module(serving_record, _args(tmp_path))
    assert r["failed"] and r["reason"] == "bad_record"


def test_model_path_must_be_a_revision_directory(run_module, tmp_path):
    for bad in ("relative/dir", "/"):
        r = run_module(serving_record, _args(tmp_path, state="present", model_path=bad))
        assert r["failed"] and r["reason"] == "bad_model_path", bad
    assert not os.path.exists(tmp_path / "engine.serving.json")


def test_present_requires_the_running_engines_spec(run_module, tmp_path):
    r = run_module(serving_record, _args(tmp_path, state="present", model_path=MODEL, spec_hash=""))
    assert r["failed"] and r["reason"] == "bad_spec_hash"
