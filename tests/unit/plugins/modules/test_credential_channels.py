"""Every channel a credential can come in by goes through the one rule (``common/_secrets``): no module takes a
URL, a header, an environment or a command without it, and nothing builds a ``--header`` argument.

The argument spec of every module is read as AnsibleModule receives it (``main()`` is run up to the constructor),
so options added by helpers (``_k8s_client.argument_spec()``, ``_render_dir.argument_spec()``) count too:

* an option that takes a URL (named ``url``, ``*_url``, ``*_urls``, or the Kubernetes ``host`` / ``proxy``;
  suboptions as ``peers[].url``) is listed in the module's ``refuse_url_credentials`` call, which refuses
  ``user:password@`` and ``?token=`` alike (``_secrets.credential_in_url``);
* an option of request headers (``headers``, ``*_headers``) or of an environment (``env``, ``*_env``) is
  ``no_log``;
* a command option (``command``, ``*_command``) is masked by the rule: the module calls
  ``_secrets.hide_command_credentials``, or the file named in :data:`COMMAND_OWNERS` scans it with
  ``_secrets.Scan().command``;
* no file of ``plugins/`` writes a ``--header`` argument: headers travel in the environment
  (``_bench_client.client_env``) or a Secret (``_bench_job``), never on a command line.
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULES = os.path.join(ROOT, "plugins", "modules")
PKG = "ansible_collections.llmops.serving.plugins"

#: Request options named like headers that hold no request credential, and why.
NOT_REQUEST_HEADERS = {
    ("k8s_engine_wait", "answer_headers"): "the response headers of a recorded answer (target-pod), judged, not sent",
}
#: Modules whose command option is scanned by the rule in another file: module -> (file, what it calls).
COMMAND_OWNERS = {
    "engine_process": "plugins/module_utils/engine/_process.py",
    "engine_manifests": "plugins/module_utils/kube/_k8s_checks.py",
}


class _Spec(Exception):
    pass


def _spec(name):
    """The argument spec module ``name`` gives AnsibleModule (None when it builds none)."""
    from unittest import mock

    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    mod = importlib.import_module("%s.modules.%s" % (PKG, name))
    if not hasattr(mod, "main"):
        return None  # the documentation of an action plugin: the action takes no URL, header or command
    seen = {}

    def init(self, argument_spec=None, **kwargs):
        seen["spec"] = argument_spec
        raise _Spec()

    with patch_module_args({}), mock.patch.object(basic.AnsibleModule, "__init__", init):
        try:
            mod.main()
        except _Spec:
            pass
    return seen.get("spec")


def _options(spec, prefix=""):
    """``(path, option spec)`` of every option, suboptions as ``parent[].child``."""
    for key, opt in (spec or {}).items():
        path = prefix + key
        yield path, opt
        if isinstance(opt, dict) and opt.get("options"):
            yield from _options(opt["options"], path + "[].")


def _credentials_no_log(suboptions):
    """True for a headers option with fixed suboptions whose credential ones are each ``no_log``
    (kubernetes.core's ``proxy_headers``: ``proxy_basic_auth``, ``basic_auth``)."""
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    if not suboptions:
        return False
    return all(o.get("no_log") is True for k, o in suboptions.items()
               if _secrets.is_credential_header(k) or "auth" in k.lower())


def _module_names():
    return sorted(n[:-3] for n in os.listdir(MODULES) if n.endswith(".py") and not n.startswith("_"))


def _source(name):
    with open(os.path.join(MODULES, name + ".py"), encoding="utf-8") as f:
        return f.read()


def _refused_paths(name):
    """Option paths named in the module's ``refuse_url_credentials`` calls (string keys, ``dict(key=...)``
    keywords, ``dict.fromkeys`` tuples, and module constants such as ``_k8s_client.URL_OPTIONS``)."""
    tree = ast.parse(_source(name))
    paths = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "refuse_url_credentials"):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                paths.add(sub.value)
            elif isinstance(sub, ast.keyword) and sub.arg:
                paths.add(sub.arg)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.attr.isupper():
                for package in ("kube", "common", "engine", "bench", "stage", "cache", "transport"):
                    try:
                        owner = importlib.import_module("%s.module_utils.%s.%s" % (PKG, package, sub.value.id))
                    except ImportError:
                        continue
                    paths.update(getattr(owner, sub.attr, {}) or {})
    return paths


def _is_url_option(path):
    last = path.rsplit(".", 1)[-1]
    return last in ("url", "host", "proxy") or last.endswith(("_url", "_urls"))


@pytest.mark.parametrize("name", _module_names())
def test_every_url_option_goes_through_the_one_rule(name):
    spec = _spec(name)
    urls = [p for p, dummy in _options(spec) if _is_url_option(p)]
    if not urls:
        return
    refused = _refused_paths(name)
    missing = [p for p in urls if p not in refused]
    assert not missing, ("plugins/modules/%s.py: the URL option(s) %s are not in a refuse_url_credentials call; a URL "
                         "is echoed in results and job events, so credentials in it (user:password@, ?token=) "
                         "must be refused before anything is done" % (name, ", ".join(missing)))


@pytest.mark.parametrize("name", _module_names())
def test_every_header_and_env_option_is_no_log(name):
    bad = []
    for path, opt in _options(_spec(name)):
        last = path.rsplit(".", 1)[-1]
        if (name, last) in NOT_REQUEST_HEADERS:
            continue
        if last in ("headers", "env") or last.endswith(("_headers", "_env")):
            if not (isinstance(opt, dict) and (opt.get("no_log") is True or _credentials_no_log(opt.get("options")))):
                bad.append(path)
    assert not bad, ("plugins/modules/%s.py: %s must be no_log=True: request headers and environments carry "
                     "credentials (Authorization, HF_TOKEN)" % (name, ", ".join(bad)))


@pytest.mark.parametrize("name", _module_names())
def test_every_command_option_is_masked_by_the_one_rule(name):
    commands = [p for p, dummy in _options(_spec(name)) if p.rsplit(".", 1)[-1] == "command"
                or p.endswith("_command")]
    if not commands:
        return
    if name in COMMAND_OWNERS:
        with open(os.path.join(ROOT, COMMAND_OWNERS[name]), encoding="utf-8") as f:
            owner = f.read()
        assert "_secrets.Scan(" in owner and ".command(" in owner, COMMAND_OWNERS[name]
        return
    src = _source(name)
    missing = [p for p in commands if not re.search(r"hide_command_credentials\([^)]*[\"']%s[\"']" % re.escape(p), src)]
    assert not missing, ("plugins/modules/%s.py: the command option(s) %s are not masked: call "
                         "_secrets.hide_command_credentials(module, %s) (env HF_TOKEN=..., export KEY=... in bash "
                         "-c, --api-key X)" % (name, ", ".join(missing), ", ".join(repr(p) for p in missing)))


def test_no_file_writes_a_header_argument():
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "plugins")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if not fn.endswith(".py"):
                continue
            path = os.path.join(dirpath, fn)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() in (
                        "--header", "-H"):
                    found.append("%s:%d" % (os.path.relpath(path, ROOT), node.lineno))
    assert not found, ("a --header argument is built at %s: headers (Authorization among them) go in the "
                       "environment (_bench_client.client_env) or a Secret (_bench_job), never on a command line, "
                       "which every local user reads in /proc/<pid>/cmdline" % ", ".join(found))


def test_the_scan_catches_a_module_that_skips_the_rule(tmp_path, monkeypatch):
    """The checks above fail for a module that takes a URL, headers or a command without the rule."""
    (tmp_path / "leaky.py").write_text('''
from ansible.module_utils.basic import AnsibleModule
def main():
    AnsibleModule(argument_spec=dict(base_url=dict(type="str"), headers=dict(type="dict"),
                                      warmup_command=dict(type="list")))
''')
    modules = importlib.import_module("%s.modules" % PKG)
    monkeypatch.setattr(modules, "__path__", [str(tmp_path)] + list(modules.__path__))
    monkeypatch.setitem(globals(), "MODULES", str(tmp_path))
    monkeypatch.delitem(sys.modules, "%s.modules.leaky" % PKG, raising=False)
    with pytest.raises(AssertionError, match="base_url are not in a refuse_url_credentials call"):
        test_every_url_option_goes_through_the_one_rule("leaky")
    with pytest.raises(AssertionError, match="headers must be no_log"):
        test_every_header_and_env_option_is_no_log("leaky")
    with pytest.raises(AssertionError, match="warmup_command are not masked"):
        test_every_command_option_is_masked_by_the_one_rule("leaky")
    sys.modules.pop("%s.modules.leaky" % PKG, None)
