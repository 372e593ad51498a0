# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the command rule: the engine is the foreground process.

A wrapper that outlives the engine (``bash -c "vllm serve ...; true"``, ``nohup ... &``, ``| tee``, ``setsid``
without ``--wait``) would have its own exit status recorded instead of the engine's. :func:`command_problems` says
why a command would do that (shell scripts are tokenised by :func:`shell_tokens`, ``#!`` scripts read when they
are on this host); :func:`check_command` refuses it with :class:`_process_state.ProcessError` naming the field.
Used for local engines and for container commands rendered for Kubernetes (``read_files=False``).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil

from ansible_collections.llmops.serving.plugins.module_utils.common._fsutil import read_part
from ansible_collections.llmops.serving.plugins.module_utils.engine._process_state import ProcessError


# --------------------------------------------------------------------------------------------- #
# Command rule: the engine is the foreground process, so its exit status is the one recorded
# --------------------------------------------------------------------------------------------- #

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh"}
# What a script may 'exec' last that is certainly not an engine: the status would be this command's
# ('...; exec true' exits 0, 'exec sleep infinity' keeps a container Running with no engine in it).
NOT_AN_ENGINE = {"true", "false", ":", "exit", "sleep", "tail", "echo", "printf", "wait", "cat"}
# Prefix commands that exec (or wait for) the command they are given and pass its status on.
PREFIXES = {"nohup", "nice", "ionice", "taskset", "numactl", "chrt", "stdbuf", "timeout", "sudo", "setpriv",
            "prlimit", "cgexec", "busybox", "unbuffer", "doas", "runuser", "time", "catchsegv"}
_OPERATORS = ["&>>", ";;&", "<<<", "<<-", "&&", "||", "|&", ";;", ";&", ">>", "<<", ">&", "<&", "<>", ">|", "&>",
              "|", "&", ";", "<", ">", "(", ")"]
_CONTROL = {"&&", "||", "|", "|&", "&", ";", ";;", ";&", ";;&", "\n"}
_FIX = ("Make the engine the foreground process: give it as plain argv (command: [vllm, serve, ...]), or end "
        "the script with 'exec ENGINE ARGS', e.g. bash -lc 'source /opt/venv/bin/activate && exec vllm serve ...'; "
        "engine_process already writes the engine's output to its log file, so no tee or '&' is needed")


class _ShellSyntax(ValueError):
    pass


def _scan_quoted(s, i):
    """Index after the quote that closes ``s[i]`` (``'`` or a backtick): nothing inside escapes it."""
    j = s.find(s[i], i + 1)
    if j < 0:
        raise _ShellSyntax("an unterminated %s quote" % s[i])
    return j + 1


def _scan_balanced(s, i, open_ch, close_ch):
    """Index after the ``close_ch`` matching ``s[i] == open_ch``, skipping quoted parts."""
    depth = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            i = _scan_quoted(s, i)
            continue
        if c == '"':
            i = _scan_double(s, i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _ShellSyntax("an unterminated %s...%s" % (open_ch, close_ch))


def _scan_double(s, i):
    """Index after the double-quoted string starting at ``s[i] == '"'``."""
    i += 1
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif s.startswith("$(", i):
            i = _scan_balanced(s, i + 1, "(", ")")
        elif c == "`":
            i = _scan_quoted(s, i)
        else:
            i += 1
    raise _ShellSyntax('an unterminated " quote')


def shell_tokens(script):
    """``[(kind, text)]`` with kind ``word``, ``op`` (control operator or newline) or ``redir``.

    Enough of the POSIX shell grammar to find commands, pipelines and background jobs: quotes, backslashes,
    ``$(...)``, ``${...}``, backticks and process substitution stay inside their word; comments are dropped.
    """
    toks = []
    buf = []
    i = 0
    n = len(script)

    def flush():
        if buf:
            toks.append(("word", "".join(buf)))
            del buf[:]

    while i < n:
        c = script[i]
        if c in " \t\r":
            flush()
            i += 1
        elif c == "\n":
            flush()
            toks.append(("op", "\n"))
            i += 1
        elif c == "#" and not buf:
            while i < n and script[i] != "\n":
                i += 1
        elif c == "\\":
            if script.startswith("\\\n", i):
                i += 2
            else:
                buf.append(script[i:i + 2])
                i += 2
        elif c in "'`":
            j = _scan_quoted(script, i)
            buf.append(script[i:j])
            i = j
        elif c == '"':
            j = _scan_double(script, i)
            buf.append(script[i:j])
            i = j
        elif c == "$" and script.startswith("$(", i):
            j = _scan_balanced(script, i + 1, "(", ")")
            buf.append(script[i:j])
            i = j
        elif c == "$" and script.startswith("${", i):
            j = _scan_balanced(script, i + 1, "{", "}")
            buf.append(script[i:j])
            i = j
        elif c in "<>" and script.startswith("(", i + 1):
            j = _scan_balanced(script, i + 1, "(", ")")
            buf.append(script[i:j])
            i = j
        elif c in "|&;<>()":
            op = next(o for o in _OPERATORS if script.startswith(o, i))
            is_redir = op[0] in "<>" or op in ("&>", "&>>")
            if is_redir and buf and "".join(buf).isdigit():
                del buf[:]  # "2>&1": the digits are the file descriptor, not a word
            flush()
            if op in ("<<", "<<-"):
                raise _ShellSyntax("a here-document, which this check does not follow")
            toks.append(("redir" if is_redir else "op", op))
            i += len(op)
        else:
            buf.append(c)
            i += 1
    flush()
    return toks


def shell_commands(script):
    """Simple commands of ``script`` as ``[{"words", "before", "after"}]`` (``before``/``after``: the operators)."""
    cmds = []
    cur = {"words": [], "before": None, "after": None}
    want_target = False
    for kind, text in shell_tokens(script):
        if kind == "redir":
            want_target = True
            continue
        if kind == "word":
            if want_target:
                want_target = False
                continue
            cur["words"].append(text)
            continue
        if text in ("(", ")"):
            cur["words"].append(text)
            continue
        if cur["words"]:
            cur["after"] = text
            cmds.append(cur)
            cur = {"words": [], "before": text, "after": None}
        elif text not in ("\n", ";"):
            cur["before"] = text
    if cur["words"]:
        cmds.append(cur)
    return cmds


def _unquote(word):
    """Literal value of a shell word, or None when it expands something at run time."""
    if "$" in word or "`" in word:
        return None
    try:
        parts = shlex.split(word)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 else None


def _is_assignment(word):
    return re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word) is not None


def _shown(words):
    """The first word or two of a command, for a message (short literal words only)."""
    first = os.path.basename(_unquote(words[0]) or words[0])
    if len(words) > 1 and len(words[1]) <= 10 and re.match(r"^[A-Za-z0-9_.:-]+$", words[1]):
        return "%s %s" % (first, words[1])
    return first


def _exec_target(words):
    """Words after ``exec`` and its options when ``words`` is ``[VAR=x ...] exec [-a n] [-cl] CMD ...``."""
    i = 0
    while i < len(words) and _is_assignment(words[i]):
        i += 1
    if i >= len(words) or words[i] != "exec" or "(" in words or ")" in words:
        return None
    i += 1
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        i += 2 if words[i] == "-a" else 1
    if i < len(words) and words[i] == "--":
        i += 1
    return words[i:] or None


def _script_reasons(script):
    """Why ``script`` would hide the engine's exit status (empty: it does not), and the exec'd argv."""
    try:
        cmds = shell_commands(script)
        ops = [t for k, t in shell_tokens(script) if k == "op"]
    except _ShellSyntax as e:
        return ["the script cannot be checked: it has %s" % e], None
    reasons = []
    if "&" in ops:
        reasons.append("'&' runs a command in the background (nohup ... & included): the shell goes on without "
                       "waiting, so the engine is no longer the supervised process")
    if not cmds:
        return reasons + ["the script is empty"], None
    exec_idx = None
    for idx, cmd in enumerate(cmds):
        if _exec_target(cmd["words"]):
            exec_idx = idx
    last = cmds[-1]
    if exec_idx is None:
        first = _unquote(last["words"][0]) or last["words"][0]
        if "(" in last["words"] or ")" in last["words"]:
            reasons.append("the engine runs in a subshell '( ... )', so the shell is the supervised process")
        elif last["before"] in ("|", "|&"):
            reasons.append("the script pipes into '%s' ('|'): a pipeline's exit status is its last command's "
                           "(tee's 0 after the engine crashed), not the engine's" % os.path.basename(first))
        elif last["before"] == "||":
            reasons.append("'|| %s' at the end replaces the engine's failure with that command's status"
                           % _shown(last["words"]))
        else:
            reasons.append("its last command ('%s') does not 'exec' the engine ('exec ENGINE ...'), so the status "
                           "recorded would be that command's or the shell's, not the engine's" % _shown(last["words"]))
        return reasons, None
    ex = cmds[exec_idx]
    if ex["before"] in ("|", "|&") or ex["after"] in ("|", "|&"):
        piped = cmds[exec_idx + 1]["words"][0] if ex["after"] in ("|", "|&") and exec_idx + 1 < len(cmds) else "?"
        reasons.append("the engine's exec is part of a pipeline (into '%s'): a pipeline's exit status is its last "
                       "command's, not the engine's" % os.path.basename(_unquote(piped) or piped))
    elif exec_idx < len(cmds) - 1:
        after = cmds[exec_idx + 1]
        reasons.append("'%s %s' after the engine's exec: commands after the engine replace its exit status; exec "
                       "must be the script's last command" % (ex["after"].strip() or "newline", _shown(after["words"])))
    if ex["before"] == "||":
        reasons.append("'|| exec ...' starts the engine only when the command before it fails; otherwise the "
                       "script ends with success and no engine")
    target = [_unquote(w) for w in _exec_target(ex["words"])]
    name = os.path.basename(target[0]) if target and target[0] else ""
    if name in NOT_AN_ENGINE:
        reasons.append("its last 'exec' runs '%s', not the engine, so the status recorded would be that command's"
                       % name)
    return reasons, (target if all(t is not None for t in target) else None)


def _strip_env(argv):
    """The command ``env [OPTIONS] [NAME=VALUE]... COMMAND...`` runs (``[]`` when it runs none)."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-S", "--split-string") and i + 1 < len(argv):
            return shlex.split(argv[i + 1]) + argv[i + 2:]
        if a.startswith("--split-string="):
            return shlex.split(a.split("=", 1)[1]) + argv[i + 1:]
        if a.startswith("-S") and len(a) > 2:
            return shlex.split(a[2:]) + argv[i + 1:]
        if a in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif a.startswith("-") or _is_assignment(a):
            i += 1
        else:
            break
    return argv[i:]


def _shell_script(argv):
    """``(script text, where)`` run by the shell ``argv``, or ``(None, file)`` for a script file."""
    i = 1
    script_c = False
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("--rcfile", "--init-file"):
            i += 2
            continue
        if a.startswith("--"):
            i += 1
            continue
        if a[:1] in "-+" and len(a) > 1:
            letters = a[1:]
            script_c = script_c or "c" in letters
            i += 1 + sum(1 for ch in letters if ch in "oO")
            continue
        break
    if script_c:
        return (argv[i], "-c") if i < len(argv) else ("", "-c")
    return None, (argv[i] if i < len(argv) else None)


def _shebang_shell(path):
    """Shell argv of a ``#!`` line naming a shell (``/bin/bash -e``, ``/usr/bin/env bash``), else None."""
    head = read_part(path, 256)
    if head is None or not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if line and os.path.basename(line[0]) == "env":
        line = _strip_env(line)
    return line if line and os.path.basename(line[0]) in SHELLS else None


def _read_script(path):
    data = read_part(path, 1 << 20)
    return None if data is None else data.decode("utf-8", "replace")


def _resolve(cmd0, path_env, chdir):
    if "/" in cmd0:
        return os.path.join(chdir or os.getcwd(), cmd0)
    return shutil.which(cmd0, path=path_env)


def command_problems(argv, path_env=None, chdir=None, _depth=0, read_files=True):
    """Reasons why ``argv`` would hide the engine's exit status; empty when the engine is the foreground process.

    * ``env [NAME=VALUE]... CMD`` and prefix commands that exec or wait for their command (``nohup``, ``nice``,
      ``numactl``…) are looked through; ``env`` without a command (it prints the environment) is refused.
    * ``setsid`` without ``--wait`` is refused: the engine is started as a process-group leader, so setsid forks
      and exits 0 at once.
    * A shell (``bash -c SCRIPT``, ``sh script.sh``, or a file whose ``#!`` names a shell) must end its script
      with ``exec ENGINE ...``; a pipeline into the engine's output (``| tee``), a background job (``&``,
      ``nohup ... &``) or any command after the engine (``; true``, ``|| true``, ``; exit 0``) is refused.

    ``read_files=False`` is for a command that runs elsewhere (a container image): script files and ``#!`` lines
    are not read from this host; a shell running a script file is refused because it cannot be checked.
    """
    if _depth > 8 or not argv:
        return [] if argv else ["the command is empty"]
    base = os.path.basename(argv[0])
    if base == "env":
        rest = _strip_env(list(argv))
        if not rest:
            return ["'env' without a command prints the whole environment (secrets included) into the log and "
                    "starts no engine"]
        return command_problems(rest, path_env, chdir, _depth + 1, read_files)
    if base == "setsid":
        i = 1
        wait = False
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
            wait = wait or argv[i] == "--wait" or (not argv[i].startswith("--") and "w" in argv[i])
            i += 1
        if not wait:
            return ["'setsid' without --wait forks the engine away and exits 0 at once (engine_process already "
                    "gives the engine its own session; drop setsid)"]
        return command_problems(argv[i + (i < len(argv) and argv[i] == "--"):], path_env, chdir, _depth + 1, read_files)
    if base in PREFIXES:
        for i in range(1, len(argv)):
            if os.path.basename(argv[i]) in SHELLS | {"env", "setsid"}:
                return command_problems(argv[i:], path_env, chdir, _depth + 1, read_files)
        return []
    if base in SHELLS:
        script, where = _shell_script(list(argv))
        if script is None:
            if where is None:
                return ["the shell reads its script from standard input, which is empty for the engine"]
            if not read_files:
                return ["the shell runs the script file %s, which cannot be checked from here; put the script in "
                        "the command ('-c') with 'exec' before the engine, or run the engine directly" % where]
            target = _resolve(where, path_env, chdir) if "/" in where else os.path.join(chdir or os.getcwd(), where)
            script = _read_script(target) if target else None
            if script is None:
                return ["the shell runs the script file %s, which cannot be read to check it" % where]
    else:
        target = _resolve(argv[0], path_env, chdir) if read_files else None
        shell = _shebang_shell(target) if target else None
        if not shell:
            return []
        script = _read_script(target)
        if script is None:
            return []
    reasons, exec_argv = _script_reasons(script)
    if not reasons and exec_argv:
        reasons = command_problems(exec_argv, path_env, chdir, _depth + 1, read_files)
    return reasons


def check_command(argv, path_env=None, chdir=None, field="command"):
    """Raise :class:`ProcessError` naming ``field`` when ``argv`` would hide the engine's exit status."""
    if not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise ProcessError("%s: must be a non-empty list of strings (the engine's argv, no shell)" % field,
                           reason="bad_command")
    reasons = command_problems(list(argv), path_env, chdir)
    if reasons:
        raise ProcessError(
            "%s: the engine would not be the foreground process, so its crash would be recorded as the wrapper's "
            "status: %s. %s."
            % (field, "; ".join(reasons), _FIX), reason="masked_exit_status")
