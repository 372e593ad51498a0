"""reference_generate with cache_dir: transformers' answer is computed once per request and revision, and an answer
is served again only for the very request it was computed for. The interpreter here is a script that records each
generation it runs and prints a fixed, valid result; it answers the package-version query like a real one."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference
from ansible_collections.llmops.serving.plugins.modules import reference_generate
from tests.lib.refusals import assert_refused

ANSWER = {"references": [{"prompt": "The model is staged", "prompt_token_ids": [1, 450, 1904],
                          "token_ids": [338, 263, 1243], "text": " is a test"}],
          "load_seconds": 12.5, "generate_seconds": 3.25,
          "library_versions": {"torch": "2.8.0", "transformers": "4.56.1"}}


def _fake_python(tmp_path, name="python", torch="2.8.0"):
    """An interpreter that counts its generations in ``<name>.runs`` and prints ANSWER."""
    runs = tmp_path / (name + ".runs")
    answer = tmp_path / (name + ".answer")
    answer.write_text(json.dumps(ANSWER) + "\n")
    p = tmp_path / name
    p.write_text("#!/bin/sh\n"
                 'case "$2" in *importlib*) echo \'{"torch": "%s", "transformers": "4.56.1"}\'; exit 0;; esac\n'
                 "cat >/dev/null\necho run >> %s\ncat %s\n" % (torch, runs, answer))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p), runs


def _runs(runs):
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def _model(tmp_path):
    d = tmp_path / "models" / "tiny-llama" / "8f94f6f0fade"
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    (d / "SHA256SUMS").write_text("aa  config.json\nbb  model.safetensors\n")
    return d


@pytest.fixture
def env(tmp_path):
    python, runs = _fake_python(tmp_path)
    model = _model(tmp_path)
    cache = tmp_path / "run" / "references"
    args = {"model_path": str(model), "prompts": ["The model is staged"], "max_new_tokens": 16,
            "python": python, "cache_dir": str(cache)}
    return {"args": args, "runs": runs, "model": model, "cache": cache, "tmp": tmp_path}


def _entries(cache):
    return sorted(n for n in os.listdir(cache) if n.endswith(".json")) if cache.exists() else []


def test_second_call_is_served_without_running_the_interpreter(run_module, env):
    first = run_module(reference_generate, env["args"])
    second = run_module(reference_generate, env["args"])
    assert first["cached"] is False and second["cached"] is True
    assert first["changed"] is False and second["changed"] is False
    assert _runs(env["runs"]) == 1
    assert second["references"] == first["references"] == ANSWER["references"]
    keys = set(ANSWER) | {"cached"}
    assert keys <= set(first) and keys <= set(second)
    assert dict((k, second[k]) for k in ANSWER) == dict((k, first[k]) for k in ANSWER) == ANSWER


def test_entries_are_private_and_the_directory_is_created_0700(run_module, env):
    run_module(reference_generate, env["args"])
    assert stat.S_IMODE(os.stat(env["cache"]).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(env["cache"].parent).st_mode) == 0o700  # the run dir it created, as the supervisor would
    (entry,) = _entries(env["cache"])
    assert stat.S_IMODE(os.stat(env["cache"] / entry).st_mode) == 0o600
    assert not [n for n in os.listdir(env["cache"]) if ".tmp-" in n]


def test_without_cache_dir_every_call_computes(run_module, env):
    args = dict(env["args"], cache_dir="")
    assert run_module(reference_generate, args)["cached"] is False
    assert run_module(reference_generate, args)["cached"] is False
    assert _runs(env["runs"]) == 2 and not env["cache"].exists()


def _touch_shard(env):
    p = env["model"] / "model.safetensors"
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))


def _grow_shard(env):
    p = env["model"] / "model.safetensors"
    st = p.stat()
    p.write_bytes(b"\0" * 65)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: the size alone misses


def _rewrite_sums(env):
    p = env["model"] / "SHA256SUMS"
    st = p.stat()
    p.write_text("ab  config.json\nbb  model.safetensors\n")  # same size and mtime: the bytes alone miss
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _add_file(env):
    (env["model"] / "tokenizer.json").write_text("{}")


def _other_python(env):
    env["args"]["python"] = _fake_python(env["tmp"], "python-b")[0]


def _upgraded_torch(env):
    # same interpreter path; its torch version changed (rewritten script, same mtime)
    p = env["args"]["python"]
    st = os.stat(p)
    with open(p) as f:
        text = f.read()
    with open(p, "w") as f:
        f.write(text.replace("2.8.0", "2.9.0", 1))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("change", [
    lambda env: env["args"].update(prompts=["Prefill computes the prompt"]),
    lambda env: env["args"].update(prompts=["The model is staged", "Prefill computes the prompt"]),
    lambda env: env["args"].update(max_new_tokens=8),
    lambda env: env["args"].update(dtype="bfloat16"),
    _touch_shard, _grow_shard, _rewrite_sums, _add_file, _other_python, _upgraded_torch,
], ids=["prompt", "more prompts", "max_new_tokens", "dtype", "file mtime", "file size", "SHA256SUMS bytes",
        "new file", "other python", "torch upgrade"])
def test_any_change_of_the_request_misses(run_module, env, change):
    assert run_module(reference_generate, env["args"])["cached"] is False
    change(env)
    again = run_module(reference_generate, env["args"])
    assert again["cached"] is False
    assert _runs(env["runs"]) + _runs(env["tmp"] / "python-b.runs") == 2
    assert len(_entries(env["cache"])) == 2
    # the new request is now a hit
    assert run_module(reference_generate, env["args"])["cached"] is True


def test_the_same_files_through_another_spelling_of_the_path_hit(run_module, env):
    run_module(reference_generate, env["args"])
    link = env["tmp"] / "current"
    link.symlink_to(env["model"])
    assert run_module(reference_generate, dict(env["args"], model_path=str(link)))["cached"] is True
    assert _runs(env["runs"]) == 1


def _foreign(path, doc):
    doc["key"] = "0" * 64
    return json.dumps(doc)


@pytest.mark.parametrize("spoil", [
    lambda path, doc: json.dumps(doc)[:-40],
    lambda path, doc: "not json at all",
    lambda path, doc: "",
    lambda path, doc: json.dumps([doc]),
    _foreign,
    lambda path, doc: json.dumps(dict(doc, format=99)),
    lambda path, doc: json.dumps(dict(doc, result={"references": "forged"})),
    lambda path, doc: json.dumps(dict(doc, result=dict(doc["result"], failed=True))),
    lambda path, doc: json.dumps(dict(doc, pad="x" * (_reference.CACHE_MAX_BYTES + 1))),
    lambda path, doc: '{"a": ' * 100 + "1" + "}" * 100,
], ids=["truncated", "not json", "empty", "not an object", "foreign key", "other format", "references not a list",
        "reserved key", "oversized", "nesting bomb"])
def test_a_spoiled_entry_is_recomputed_and_overwritten(run_module, env, spoil):
    run_module(reference_generate, env["args"])
    (name,) = _entries(env["cache"])
    path = env["cache"] / name
    path.write_text(spoil(path, json.loads(path.read_text())))
    again = run_module(reference_generate, env["args"])
    assert again["cached"] is False and again["references"] == ANSWER["references"]
    assert _runs(env["runs"]) == 2
    assert json.loads(path.read_text())["result"] == ANSWER  # overwritten with a good entry
    assert run_module(reference_generate, env["args"])["cached"] is True


def test_a_symlinked_cache_dir_is_refused(run_module, env):
    real = env["tmp"] / "elsewhere"
    real.mkdir(mode=0o700)
    env["cache"].parent.mkdir(parents=True)
    env["cache"].symlink_to(real)
    r = run_module(reference_generate, env["args"])
    assert_refused(r, option="cache_dir", reason="cache_dir",
                   words=[str(env["cache"]), "is a symlink", "point cache_dir at", "set it empty"])
    assert _runs(env["runs"]) == 0 and os.listdir(real) == []


def test_a_cache_dir_that_is_a_file_is_refused(run_module, env):
    env["cache"].parent.mkdir(parents=True)
    env["cache"].write_text("")
    r = run_module(reference_generate, env["args"])
    assert_refused(r, option="cache_dir", reason="cache_dir", words=["is not a directory"])
    assert _runs(env["runs"]) == 0


def test_a_symlinked_entry_is_refused_and_not_followed(run_module, env):
    run_module(reference_generate, env["args"])
    (name,) = _entries(env["cache"])
    path = env["cache"] / name
    target = env["tmp"] / "planted.json"
    target.write_text(path.read_text())
    path.unlink()
    path.symlink_to(target)
    r = run_module(reference_generate, env["args"])
    assert_refused(r, option="cache_dir", reason="cache_dir", words=["is a symlink", "remove it"])
    assert _runs(env["runs"]) == 1


def test_check_mode_neither_writes_nor_creates_but_still_answers(run_module, env):
    r = run_module(reference_generate, env["args"], check_mode=True)
    assert r["cached"] is False and r["changed"] is False and r["references"] == ANSWER["references"]
    assert not env["cache"].exists()
    env["cache"].mkdir(parents=True, mode=0o700)
    run_module(reference_generate, env["args"], check_mode=True)
    assert _entries(env["cache"]) == [] and _runs(env["runs"]) == 2
    # a real run writes; check mode then serves that answer without computing or touching the entry
    run_module(reference_generate, env["args"])
    (name,) = _entries(env["cache"])
    before = os.stat(env["cache"] / name).st_mtime_ns
    hit = run_module(reference_generate, env["args"], check_mode=True)
    assert hit["cached"] is True and _runs(env["runs"]) == 3
    assert os.stat(env["cache"] / name).st_mtime_ns == before


def test_prune_keeps_the_newest_entries_and_removes_dead_temp_files(tmp_path):
    for i in range(_reference.CACHE_KEEP + 5):
        p = tmp_path / ("%064x.json" % i)
        p.write_text("{}")
        os.utime(p, (1000 + i, 1000 + i))
    dead = tmp_path / ("%064x.json.tmp-1-abc" % 0)
    dead.write_text("")
    os.utime(dead, (1000, 1000))
    fresh = tmp_path / ("%064x.json.tmp-2-def" % 1)
    fresh.write_text("")
    removed = _reference.prune(str(tmp_path), now=1000 + _reference.STALE_TEMP_SECONDS + 10)
    assert sorted(removed) == sorted([dead.name] + ["%064x.json" % i for i in range(5)])
    left = sorted(n for n in os.listdir(tmp_path) if n.endswith(".json"))
    assert left == ["%064x.json" % i for i in range(5, _reference.CACHE_KEEP + 5)]
    assert fresh.exists()


def test_a_write_that_fails_is_a_warning_and_the_answer_stands(run_module, env):
    run_module(reference_generate, env["args"])
    (name,) = _entries(env["cache"])
    (env["cache"] / name).unlink()
    (env["cache"] / name).mkdir()  # the rename onto it fails (EISDIR), as a full or read-only disk would
    r = run_module(reference_generate, env["args"])
    assert r.get("failed") is not True and r["references"] == ANSWER["references"] and r["cached"] is False
    assert any(w.startswith("cache_dir: cannot write") for w in r.get("warnings", [])), r.get("warnings")
    assert _runs(env["runs"]) == 2
    assert not [n for n in os.listdir(env["cache"]) if ".tmp-" in n]
