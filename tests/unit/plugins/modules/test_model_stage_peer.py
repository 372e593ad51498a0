"""model_stage_peer refuses what it cannot serve with a failed result that names the option (``revisions[0].dest``)
and its ``reason``, never a traceback; each test gives every other option a valid value (the token's digest
included), so the refusal seen is the one the test is about."""
from __future__ import annotations

import ast
import hashlib
import os

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage_peer
from ansible_collections.llmops.serving.tests.lib.refusals import assert_refused

TOKEN_SHA256 = hashlib.sha256(b"peer-token-for-this-run-0123456789").hexdigest()


def _args(tmp_path, **kw):
    args = {"address": "127.0.0.1", "port": 18799, "token_sha256": TOKEN_SHA256, "state_dir": str(tmp_path / "state"),
            "revisions": [{"name": "m", "revision": "r1", "dest": str(tmp_path / "nvme" / "m" / "r1")}]}
    args.update(kw)
    return args


@pytest.mark.parametrize("dest, words", [("/", "root"), ("//", "root"), ("/tmp/..", "root"),
                                         ("{tmp}/nvme/.", "does not name"), ("{tmp}/nvme/..", "does not name")])
def test_a_dest_that_names_no_directory_is_a_failed_result_naming_it(run_module, tmp_path, dest, words):
    rev = {"name": "m", "revision": "r1", "dest": dest.format(tmp=tmp_path)}
    r = run_module(model_stage_peer, _args(tmp_path, revisions=[rev]), check_mode=True)
    assert_refused(r, option="revisions[0].dest", reason="bad_dest", words=(words,))
    r = run_module(model_stage_peer, _args(tmp_path, revisions=[rev]))  # not only in check mode: nothing started
    assert_refused(r, option="revisions[0].dest", reason="bad_dest")
    assert r["pid"] is None and not (tmp_path / "state").exists()


def test_the_entry_at_fault_is_the_one_named(run_module, tmp_path):
    good = {"name": "m", "revision": "r1", "dest": str(tmp_path / "nvme" / "m" / "r1")}
    r = run_module(model_stage_peer, _args(tmp_path, revisions=[good, dict(good, revision="r2", dest="/")]),
                   check_mode=True)
    assert_refused(r, option="revisions[1].dest", reason="bad_dest")
    r = run_module(model_stage_peer, _args(tmp_path, revisions=[good, dict(good, name="a/b")]), check_mode=True)
    assert_refused(r, option="revisions[1].name", reason="not_a_directory_name")
    r = run_module(model_stage_peer, _args(tmp_path, revisions=[good, dict(good)]), check_mode=True)
    assert_refused(r, option="revisions[1]", reason="duplicate_revision", words=("m/r1",))


def test_the_other_refusals_name_their_option(run_module, tmp_path):
    assert_refused(run_module(model_stage_peer, _args(tmp_path, token_sha256="abc"), check_mode=True),
                   option="token_sha256", reason="bad_token_sha256")
    assert_refused(run_module(model_stage_peer, _args(tmp_path, port=0), check_mode=True),
                   option="port", reason="bad_port")
    assert_refused(run_module(model_stage_peer, _args(tmp_path, piece_size=1000), check_mode=True),
                   option="piece_size", reason="bad_piece_size")
    assert_refused(run_module(model_stage_peer, _args(tmp_path, lifetime=-1), check_mode=True),
                   option="lifetime", reason="bad_lifetime")


@pytest.mark.parametrize("error, reason", [
    (model_stage_peer._stage_peer.PeerError("address/port: cannot listen on 127.0.0.1:18799 (in use)"), "start_failed"),
    (model_stage_peer.StageError("dest: /x is a symlink", reason="dest_symlink"), "dest_symlink"),
    (model_stage_peer.StageError("dest: gone"), "refused"),
    (OSError(28, "No space left on device"), "start_failed")])
def test_a_failure_to_start_is_a_failed_result_with_its_reason(run_module, tmp_path, monkeypatch, error, reason):
    def start(*_args, **_kw):
        raise error
    monkeypatch.setattr(model_stage_peer._stage_peer, "start", start)
    r = run_module(model_stage_peer, _args(tmp_path))
    assert_refused(r, reason=reason, words=(str(error),))
    assert r["revisions"] == ["m/r1"] and r["pid"] is None


def test_valid_options_pass_the_checks(run_module, tmp_path):
    """The refusals above are not the module refusing everything: the same options with a good dest go through."""
    r = run_module(model_stage_peer, _args(tmp_path), check_mode=True)
    assert not r.get("failed") and r["changed"] is True and r["revisions"] == ["m/r1"], r
    assert not os.path.exists(str(tmp_path / "state"))


def test_assert_refused_tells_one_refusal_from_another():
    """The check the refusal tests use fails on a failure for another reason or option, and on a bare failure."""
    r = {"failed": True, "msg": "peer_token: required with peers", "reason": "bad_token"}
    assert_refused(r, option="peer_token", reason="bad_token")
    for kw in ({"option": "revisions[0].dest"}, {"reason": "bad_dest"}, {"option": "peer_token", "words": ("dest",)}):
        with pytest.raises(AssertionError):
            assert_refused(r, **kw)
    with pytest.raises(AssertionError):
        assert_refused({"failed": True, "msg": "something failed"})  # which refusal? it must be said
    with pytest.raises(AssertionError):
        assert_refused({"changed": False, "msg": "revisions[0].dest: fine"}, option="revisions[0].dest")


def _handles_stage_error(path):
    """Lines of the ``except`` clauses in ``path`` that catch ``StageError`` and answer with ``fail_json``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        names = [t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None) for t in types]
        fails = any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "fail_json" for b in node.body
                    for n in ast.walk(b))
        if "StageError" in names and fails:
            lines.append(node.lineno)
    return lines


def test_every_module_of_the_stage_package_answers_a_stage_error_with_a_failed_result():
    """A module that calls into ``module_utils/stage`` catches ``StageError`` and fails with its message: a refusal
    of the package is a failed result, never a traceback (the one model_stage_peer had for ``dest: /``)."""
    root = os.path.dirname(os.path.abspath(model_stage_peer.__file__))
    bad = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not name.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as f:
            if "plugins.module_utils.stage" not in f.read():
                continue
        if not _handles_stage_error(path):
            bad.append("plugins/modules/%s calls the stage package but no except clause turns StageError into "
                       "fail_json(msg=..., reason=...)" % name)
    assert not bad, "\n".join(bad)
