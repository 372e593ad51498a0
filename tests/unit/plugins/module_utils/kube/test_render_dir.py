"""Rendering into a directory (render_dir of engine_manifests and pd_manifests): the marker cannot reach outside.

Both modules go through one helper, so every case runs against both modules as a playbook would call them.
"""
from __future__ import annotations

import json
import os

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _render_dir
from ansible_collections.llmops.serving.plugins.modules import engine_manifests, pd_manifests
from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang as _no_hang

ENGINE = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab",
              model_path="/mnt/nvme/models/GLM-5.2-FP8/v1", image="vllm/vllm-openai:v0.26.0")
PD = dict(model_name="glm-5.2-fp8", image="vllm/vllm-openai:v0.10.1", model_path="/models/glm",
          ucx_net_devices="mlx5_0:1,mlx5_1:1")
# module, its arguments, the directory option, and a change that renames every file
MODULES = {
    "engine_manifests": (engine_manifests, ENGINE, "render_dir", dict(served_model_name="glm-5.3-fp8-vllm")),
    "pd_manifests": (pd_manifests, PD, "render_dir", dict(model_name="glm-5.3-fp8")),
}
SECRET_CONTENT = "root-only-content-0d1f"


@pytest.fixture(params=sorted(MODULES))
def mod(request, run_module, tmp_path):
    module, args, option, rename = MODULES[request.param]
    out = tmp_path / "render"

    def run(check_mode=False, diff=False, **extra):
        return run_module(module, dict(args, **dict({option: str(out)}, **extra)), check_mode=check_mode, diff=diff)

    run.out, run.option, run.rename = out, option, rename
    return run


def _outside(tmp_path):
    victim = tmp_path / "outside" / "victim.yaml"
    victim.parent.mkdir()
    victim.write_text(SECRET_CONTENT + "\n")
    return victim


def _marker(out):
    return out / _render_dir.MARKER


def _set_marker(out, files):
    _marker(out).write_text(json.dumps({"files": files}))


def _assert_refused(r, out, victim, before):
    assert r.get("failed") is True, r
    assert str(_marker(out)) in r["msg"] and "Nothing was changed" in r["msg"]
    assert r["file"] == str(_marker(out))
    assert SECRET_CONTENT not in json.dumps(r)
    assert victim.read_text() == SECRET_CONTENT + "\n"
    assert sorted(os.listdir(out)) == before


@pytest.mark.parametrize("entry", ["../outside/victim.yaml", "ABSOLUTE", "sub/../../outside/victim.yaml"])
@pytest.mark.parametrize("check_mode", [False, True])
def test_marker_entry_outside_the_dir_is_refused_and_never_deleted_or_shown(mod, tmp_path, entry, check_mode):
    victim = _outside(tmp_path)
    assert mod()["changed"] is True
    _set_marker(mod.out, [str(victim) if entry == "ABSOLUTE" else entry])
    before = sorted(os.listdir(mod.out))
    r = mod(check_mode=check_mode, diff=True)
    _assert_refused(r, mod.out, victim, before)
    assert "remove the entry" in r["msg"]


def test_marker_entry_through_a_symlinked_dir_is_refused(mod, tmp_path):
    victim = _outside(tmp_path)
    mod()
    os.symlink(str(victim.parent), str(mod.out / "linked"))
    _set_marker(mod.out, ["linked/victim.yaml"])
    before = sorted(os.listdir(mod.out))
    r = mod(diff=True)
    _assert_refused(r, mod.out, victim, before)
    assert "symlink" in r["msg"]


def test_stale_symlink_is_removed_as_a_link_and_its_target_never_read(mod, tmp_path):
    victim = _outside(tmp_path)
    first = mod()
    link = mod.out / "05-configmap-old.yaml"
    os.symlink(str(victim), str(link))
    _set_marker(mod.out, first["files"] + [link.name])
    check = mod(check_mode=True, diff=True)
    assert check["changed"] is True and link.name in check["removed"]
    assert SECRET_CONTENT not in json.dumps(check)
    r = mod(diff=True)
    assert r["removed"] == [link.name]
    assert not os.path.lexists(str(link))
    assert victim.read_text() == SECRET_CONTENT + "\n"
    assert SECRET_CONTENT not in json.dumps(r)


def test_rendered_name_that_is_a_symlink_is_replaced_not_followed(mod, tmp_path):
    victim = _outside(tmp_path)
    first = mod()
    target = mod.out / first["files"][0]
    target.unlink()
    os.symlink(str(victim), str(target))
    r = mod(diff=True)
    assert r["changed"] is True
    assert SECRET_CONTENT not in json.dumps(r)
    assert not os.path.islink(str(target)) and yaml.safe_load(target.read_text())["kind"]
    assert victim.read_text() == SECRET_CONTENT + "\n"


@pytest.mark.parametrize("content", ["[\"10-x.yaml\"]", "{\"files\": \"10-x.yaml\"}", "not json {", "[" * 100000,
                                     "{\"files\": [1]}", "\"\""])
def test_marker_of_the_wrong_shape_is_a_clean_error(mod, content):
    mod()
    _marker(mod.out).write_text(content)
    before = {n: (mod.out / n).read_bytes() for n in os.listdir(mod.out)}
    r = mod(**mod.rename)
    assert r.get("failed") is True, r
    assert r["msg"].startswith("%s: " % mod.option) and str(_marker(mod.out)) in r["msg"]
    assert "delete it" in r["msg"] or "remove the entry" in r["msg"] or "refused" in r["msg"]
    assert {n: (mod.out / n).read_bytes() for n in os.listdir(mod.out)} == before


def test_marker_that_is_a_symlink_is_refused(mod, tmp_path):
    victim = _outside(tmp_path)
    mod()
    victim.write_text(json.dumps({"files": ["../outside/victim.yaml"]}))
    _marker(mod.out).unlink()
    os.symlink(str(victim), str(_marker(mod.out)))
    r = mod(**mod.rename)
    assert r.get("failed") is True and "is a symlink" in r["msg"]
    assert os.path.exists(str(victim))


def test_check_mode_changed_is_exactly_what_a_real_run_does(mod):
    steps = [dict(), dict(), mod.rename, mod.rename, dict()]
    for extra in steps:
        predicted = mod(check_mode=True, **extra)["changed"]
        assert mod(**extra)["changed"] is predicted
    # the files are right but the marker is gone: the next real run writes it, so check mode says changed
    _marker(mod.out).unlink()
    check = mod(check_mode=True, diff=True)
    assert check["changed"] is True and [d["after_header"] for d in check["diff"]] == [_render_dir.MARKER]
    assert not _marker(mod.out).exists()
    assert mod()["changed"] is True and _marker(mod.out).exists()
    assert mod()["changed"] is False


def test_rendered_files_spell_every_object_out_without_yaml_aliases(mod):
    # The P/D pods share one downward-API fieldRef object; a YAML dumper writes a shared object once as an anchor
    # (&id001) and then as aliases (*id001). Valid YAML, but a reader of the GitOps diff sees "*id001" where the
    # field should be, and kustomize 4.0-4.3 (kyaml) failed to build resources holding aliases
    # (kubernetes-sigs/kustomize#3675, fixed in 4.4.0; kubectl bundles older releases).
    assert mod()["changed"] is True
    texts = {p.name: p.read_text() for p in mod.out.iterdir() if p.suffix == ".yaml"}
    assert len(texts) >= 2
    for name, text in texts.items():
        events = list(yaml.parse(text))
        assert not [e for e in events if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)], name
        assert list(yaml.safe_load_all(text)), name


def test_dump_writes_a_shared_object_in_full_each_time():
    shared = {"fieldRef": {"fieldPath": "status.podIP"}}
    text = _render_dir.dump({"a": [shared, shared], "b": shared})
    assert "&" not in text and "*" not in text
    assert yaml.safe_load(text) == {"a": [shared, shared], "b": shared}


def test_render_dir_that_is_a_file_is_a_clean_error(mod):
    mod.out.write_text("x")
    r = mod()
    assert r.get("failed") is True and "is not a directory" in r["msg"] and r["msg"].startswith(mod.option)


def test_interrupted_write_leaves_no_untracked_file(mod, monkeypatch):
    first = mod()
    real = _render_dir._atomic_write
    calls = []

    def failing(directory, name, text):
        calls.append(name)
        if name != _render_dir.MARKER and len(calls) > 2:
            raise OSError(28, "No space left on device")
        return real(directory, name, text)

    monkeypatch.setattr(_render_dir, "_atomic_write", failing)
    r = mod(**mod.rename)
    assert r.get("failed") is True and "No space left on device" in r["msg"]
    monkeypatch.setattr(_render_dir, "_atomic_write", real)
    # the marker already listed the new names when the write failed, so returning to the first
    # rendering removes the half-written new files instead of leaving them for kubectl apply -f
    listed = json.loads(_marker(mod.out).read_text())["files"]
    assert set(first["files"]) <= set(listed)
    back = mod()
    assert sorted(n for n in os.listdir(mod.out) if n != _render_dir.MARKER) == sorted(first["files"])
    assert back["removed"]


@pytest.mark.parametrize("content,needle", [('{"files": ' + "[" * 100 + "]" * 100 + "}", "nests deeper"),
                                            ('{"files": [1e400]}', "number out of range"),
                                            ('{"files": [1%s]}' % ("0" * 400), "number out of range"),
                                            ('{"files": [NaN]}', "number out of range")])
def test_marker_nesting_and_numbers_are_refused_before_anything_changes(mod, content, needle):
    mod()
    _marker(mod.out).write_text(content)
    before = {n: (mod.out / n).read_bytes() for n in os.listdir(mod.out)}
    r = mod(**mod.rename)
    assert r.get("failed") is True and needle in r["msg"] and "Nothing was changed" in r["msg"], r
    assert r["file"] == str(_marker(mod.out))
    assert {n: (mod.out / n).read_bytes() for n in os.listdir(mod.out)} == before


def _lstat_says_regular(monkeypatch, path, like):
    real = os.lstat
    monkeypatch.setattr(_render_dir.os, "lstat", lambda p, *a, **k: real(like) if str(p) == str(path) else real(p, *a, **k))


def test_marker_swapped_for_a_fifo_after_the_lstat_is_refused_without_blocking(tmp_path, monkeypatch):
    out = tmp_path / "render"
    out.mkdir()
    plain = tmp_path / "plain"
    plain.write_text("{}")
    os.mkfifo(_marker(out))
    _lstat_says_regular(monkeypatch, _marker(out), plain)
    err = _no_hang(lambda: _render_dir.plan(str(out), {"a.yaml": "x\n"})).get("error")
    assert isinstance(err, _render_dir.RenderDirError) and "is not a regular file" in str(err)
    assert err.file == str(_marker(out))


def test_rendered_file_swapped_for_a_fifo_after_the_lstat_is_replaced_not_read(tmp_path, monkeypatch):
    out = tmp_path / "render"
    out.mkdir()
    plain = tmp_path / "plain"
    plain.write_text("old\n")
    os.mkfifo(out / "a.yaml")
    _lstat_says_regular(monkeypatch, out / "a.yaml", plain)
    p = _no_hang(lambda: _render_dir.plan(str(out), {"a.yaml": "x\n"}))["value"]
    assert p.changes["a.yaml"] == ("", "x\n")
