"""reference_generate reads the engine interpreter's output through the shared reader: anything that is not the
result the script prints is a clean ReferenceError_ naming the interpreter, never a traceback."""
from __future__ import annotations

import stat

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference


def _script(tmp_path, body):
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


@pytest.mark.parametrize("printed,needle", [
    ("not json", "printed no usable result"),
    ('{"references": ' + "[" * 5000 + "]" * 5000 + "}", "nests deeper than 64 levels"),
    ('{"references": [], "load_seconds": 1e400}', "not finite"),
    ('{"references": [], "load_seconds": 1%s}' % ("0" * 400), "beyond +/-2**64"),
    ('{"references": {}}', "without a list of references"),
    ("[1, 2]", "without a list of references"),
])
def test_output_that_is_not_a_result_is_a_clean_error(tmp_path, printed, needle):
    out = tmp_path / "out.json"
    out.write_text(printed + "\n")
    fake = _script(tmp_path, "cat >/dev/null\ncat %s\n" % out)
    with pytest.raises(_reference.ReferenceError_) as e:
        _reference.greedy_reference("/models/tiny", ["a"], python=fake, timeout=30)
    assert needle in str(e.value) and str(e.value).startswith("reference generation with %s" % fake)


def test_output_cannot_set_reserved_result_keys(tmp_path):
    fake = _script(tmp_path, 'cat >/dev/null\necho \'{"references": [], "changed": true, "failed": true}\'\n')
    assert _reference.greedy_reference("/m", ["a"], python=fake, timeout=30) == {"references": []}


def test_interpreter_that_cannot_start_is_named(tmp_path):
    with pytest.raises(_reference.ReferenceError_, match=r"^python: cannot run .*no-python"):
        _reference.greedy_reference("/m", ["a"], python=str(tmp_path / "no-python"), timeout=30)


def test_interpreter_that_hangs_is_stopped_at_the_timeout(tmp_path):
    fake = _script(tmp_path, "exec sleep 30\n")
    with pytest.raises(_reference.ReferenceError_, match="did not finish within 1 s"):
        _reference.greedy_reference("/m", ["a"], python=fake, timeout=1)
