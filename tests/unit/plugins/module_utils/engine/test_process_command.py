"""The engine must be the foreground process, or a crash is recorded as the wrapper's status.

Field report (section 7.3, "SGLang Crash Behind Completed / exit 0"): the engine was started as
``start 2>&1 | tee``; after all TP schedulers raised TypeError the outer shell/tee returned 0 and the crash
looked like a normal exit. The first test reproduces that with real processes; the others check that
engine_process refuses every such wrapper before anything starts and accepts ``bash -lc "exec ..."``.
Shell semantics restated here: POSIX "Pipelines" (exit status of a pipeline is that of the last command) and
"Asynchronous Lists" (``&``: the shell does not wait, the list's status is 0),
https://pubs.opengroup.org/onlinepubs/9699919799/utilities/V3_chap02.html#tag_18_09_02
"""
from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import uuid

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_command, _process_state
from ansible_collections.llmops.serving.plugins.modules import engine_process

CRASH = "%s -c 'import sys; sys.exit(3)'" % shlex.quote(sys.executable)

REFUSED = {
    "pipe to tee": ["bash", "-c", CRASH + " 2>&1 | tee LOG"],
    "pipe to tee, exec'd": ["bash", "-lc", "exec " + CRASH + " 2>&1 | tee LOG"],
    "|& tee": ["bash", "-c", "exec " + CRASH + " |& tee LOG"],
    "background &": ["sh", "-c", CRASH + " &"],
    "nohup ... &": ["sh", "-c", "nohup " + CRASH + " > LOG 2>&1 &"],
    "background then wait": ["sh", "-c", CRASH + " & wait"],
    "; true": ["bash", "-c", CRASH + "; true"],
    "|| true": ["bash", "-c", CRASH + " || true"],
    "; exit 0": ["bash", "-c", CRASH + "; exit 0"],
    "exec then ; exit 0": ["bash", "-lc", "exec " + CRASH + "; exit 0"],
    "exec then || true": ["sh", "-c", "exec " + CRASH + " || true"],
    "trailing command on a new line": ["bash", "-c", "cd /\nexec " + CRASH + "\necho done"],
    "no exec": ["bash", "-lc", "cd / && " + CRASH],
    "|| exec": ["bash", "-c", "test -d / || exec " + CRASH],
    "subshell": ["bash", "-c", "(exec " + CRASH + ")"],
    "env + bash -c | tee": ["env", "A=1", "bash", "-c", CRASH + " | tee LOG"],
    "env -i + sh -c &": ["/usr/bin/env", "-i", "sh", "-c", CRASH + " &"],
    "env -S": ["env", "-S", "bash -c '%s | tee LOG'" % CRASH.replace("'", '"')],
    "nested bash -c": ["bash", "-c", "exec bash -c \"%s | tee LOG\"" % CRASH.replace("'", "\\'")],
    "numactl + sh -c": ["numactl", "--cpunodebind=0", "sh", "-c", CRASH + " | tee LOG"],
    "setsid without --wait": ["setsid", sys.executable, "-c", "pass"],
    "env without command": ["env", "A=1"],
}


def _fill(argv, tmp_path):
    return [a.replace("LOG", str(tmp_path / "out.log")) for a in argv]


@pytest.mark.parametrize("wrapper", ["pipe to tee", "background &", "; true", "|| true", "; exit 0"])
def test_the_refused_wrappers_really_turn_a_crash_into_exit_0(tmp_path, wrapper):
    """Why: run as they are, these wrappers exit 0 while the engine exits 3."""
    assert subprocess.run([sys.executable, "-c", "import sys; sys.exit(3)"], check=False).returncode == 3
    assert subprocess.run(_fill(REFUSED[wrapper], tmp_path), timeout=30, check=False).returncode == 0
    with pytest.raises(_process_state.ProcessError):
        _process_command.check_command(_fill(REFUSED[wrapper], tmp_path))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_wrapper_that_hides_the_exit_status_is_refused_before_anything_starts(run_module, tmp_path, case):
    run_dir = tmp_path / "run"
    tok = uuid.uuid4().hex
    r = run_module(engine_process, {"name": "eng", "run_dir": str(run_dir), "command": _fill(REFUSED[case], tmp_path),
                                    "startup_grace": 0.3, "env": {"TOKEN_PROBE": tok}})
    assert r["failed"], r
    assert r["msg"].startswith("command: ") and r["reason"] == "masked_exit_status"
    assert "foreground" in r["msg"] and "exec ENGINE" in r["msg"]
    assert tok not in r["msg"]
    assert not run_dir.exists() and not (tmp_path / "out.log").exists()


def test_shell_script_file_and_shebang_script_are_checked(run_module, tmp_path):
    script = tmp_path / "start.sh"
    script.write_text("#!/bin/bash\nset -e\nexport X=1\n%s 2>&1 | tee %s\n" % (CRASH, tmp_path / "out.log"))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    for argv in ([str(script)], ["bash", str(script)], ["/usr/bin/env", "bash", str(script)]):
        r = run_module(engine_process, {"name": "eng", "run_dir": str(tmp_path / "run"), "command": argv})
        assert r["failed"] and r["msg"].startswith("command: ") and "tee" in r["msg"], (argv, r["msg"])
        assert "set -e" not in r["msg"]  # the script's content is not echoed
    good = tmp_path / "good.sh"
    good.write_text("#!/usr/bin/env bash\nset -e\ncd /\nexec %s\n" % CRASH)
    assert _process_command.command_problems([str(good)]) == []


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", "import sys; sys.exit(3)"],
    ["bash", "-lc", "exec " + CRASH],
    ["bash", "-lc", "source /dev/null && exec " + CRASH],
    ["bash", "-euo", "pipefail", "-c", "cd /\nexec >>/dev/null 2>&1\nexec " + CRASH],
    ["sh", "-c", "X=$(echo a | tr a b); export X; exec " + CRASH],
    ["env", "A=1", "B=2", "bash", "-c", "exec env C=3 " + CRASH],
    ["nohup", sys.executable, "-c", "import sys; sys.exit(3)"],
    ["setsid", "--wait", sys.executable, "-c", "import sys; sys.exit(3)"],
])
def test_foreground_engine_is_accepted_and_its_real_status_recorded(run_module, tmp_path, argv):
    assert _process_command.command_problems(argv) == []
    r = run_module(engine_process, {"name": "eng", "run_dir": str(tmp_path / "run"), "command": argv,
                                    "startup_grace": 3})
    assert r["failed"] and r["returncode"] == 3 and "exit status 3" in r["msg"], r


def test_missing_engine_binary_is_exit_127_not_a_supervisor_mystery(run_module, tmp_path):
    missing = str(tmp_path / "no-such-engine")
    r = run_module(engine_process, {"name": "eng", "run_dir": str(tmp_path / "run"), "command": [missing],
                                    "startup_grace": 1})
    assert r["failed"] and r["returncode"] == 127 and "exit status 127" in r["msg"]
    assert any("cannot start" in line for line in r["log_tail"])
    assert os.path.exists(r["log_file"])


@pytest.mark.parametrize("script", ["vllm serve /m; exec true", "exec sleep infinity", "exec tail -f /dev/null"])
def test_an_exec_of_something_that_is_not_an_engine_is_refused(script):
    # the one rule for local engines and container commands: the status would be that command's
    reasons = _process_command.command_problems(["bash", "-lc", script])
    assert any("not the engine" in r for r in reasons), reasons


@pytest.mark.parametrize("script,quote", [
    ("exec vllm serve 'a b", "'"), ("exec vllm serve `date", "`"), ('exec vllm serve "x `date"', "`"),
    ("exec vllm serve $(echo 'a)", "'"),
])
def test_an_unterminated_quote_is_named(script, quote):
    with pytest.raises(ValueError, match="an unterminated %s quote" % quote):
        _process_command.shell_tokens(script)


def test_single_quotes_and_backticks_stay_inside_their_word():
    assert _process_command.shell_tokens("exec vllm serve 'a b'`date`x") == [
        ("word", "exec"), ("word", "vllm"), ("word", "serve"), ("word", "'a b'`date`x")]
