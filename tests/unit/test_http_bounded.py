"""Every HTTP request of the collection is bounded: it goes through ``common/_http.py``, whose timeout is a deadline
for the whole answer and whose ``max_bytes`` caps the body while it is read (docs/development.md, "Where each idea
lives"). A file under ``plugins/`` that imports an HTTP client itself (``urllib.request``, ``http.client``,
``ansible.module_utils.urls``, ``requests``, ``urllib3``, ``httpx``, ``aiohttp``) or calls one (``urlopen``,
``open_url``, ``fetch_url``, ``HTTPConnection``) would read an answer without either bound, so it is named here
unless :data:`ALLOWED` names it with its owner and why."""
from __future__ import annotations

import ast
import os

from ansible_collections.llmops.serving.plugins.module_utils.common import _http

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = os.path.join(ROOT, "plugins")

#: Modules that are HTTP clients (an import of the module or of anything in it).
CLIENTS = ("urllib.request", "http.client", "ansible.module_utils.urls", "requests", "urllib3", "httpx", "aiohttp")
#: Names that send a request when called.
SENDERS = ("urlopen", "open_url", "fetch_url", "HTTPConnection", "HTTPSConnection")

#: file under plugins/ -> (the clients it may import, its owner and why it is not a bypass).
ALLOWED = {
    "module_utils/common/_http.py": (
        ("urllib.request", "http.client", "ansible.module_utils.urls"),
        "the one client (common): the deadline and the cap live here"),
    "module_utils/kube/_k8s_client.py": (
        ("urllib3",),
        "kube: configures the kubernetes client's transport (proxy headers, certificate warnings); it sends "
        "nothing itself"),
}


def _client_of(module):
    for client in CLIENTS:
        if module == client or module.startswith(client + "."):
            return client
    return None


def findings(path):
    """``(line, client or sender)`` for every HTTP client import and sender call in the Python file ``path``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, c) for c in (_client_of(a.name) for a in node.names) if c]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            client = _client_of(node.module)
            if client is None:  # from urllib import request, from http import client, from ansible... import urls
                client = next((c for c in (_client_of("%s.%s" % (node.module, a.name)) for a in node.names) if c),
                              None)
            if client:
                out.append((node.lineno, client))
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            if name in SENDERS:
                out.append((node.lineno, name + "()"))
    return out


def violations(plugins=PLUGINS, allowed=None):
    """Every unbounded HTTP client under ``plugins``, as a message naming the file, the line and the fix."""
    allowed = ALLOWED if allowed is None else allowed
    bad = []
    for dirpath, dirnames, filenames in os.walk(plugins):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), plugins).replace(os.sep, "/")
            may = allowed.get(rel, ((), ""))[0]
            for line, what in findings(os.path.join(dirpath, name)):
                if what.endswith("()") and rel in allowed or what in may:
                    continue
                bad.append("plugins/%s:%d uses %s directly: its answer would have no deadline and no size cap; "
                           "send the request through common/_http.py (request, get_json, get_text, post_json, "
                           "open_response)" % (rel, line, what))
    return bad


def test_every_http_request_goes_through_the_bounded_client():
    assert violations() == []


def test_every_allowed_file_exists_and_says_why():
    for rel, (clients, why) in ALLOWED.items():
        assert os.path.isfile(os.path.join(PLUGINS, rel)), rel
        assert clients and why and all(c in CLIENTS for c in clients), rel


def test_the_client_has_a_default_cap_for_every_kind_of_answer():
    assert 0 < _http.MAX_ERROR_BYTES < _http.MAX_ANSWER_BYTES <= _http.MAX_METRICS_BYTES
    assert 0 < _http.MAX_LINE_BYTES <= _http.MAX_ANSWER_BYTES


def _tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_direct_client_is_named_with_its_file_and_the_fix(tmp_path):
    plugins = _tree(tmp_path, {
        "modules/probe.py": "import urllib.request\nurllib.request.urlopen('http://x').read()\n",
        "module_utils/transport/_scrape.py": "from http import client\nfrom ansible.module_utils.urls import open_url\n",
        "module_utils/engine/_fetch.py": "def f(module):\n    import requests\n    return fetch_url(module, 'u')\n",
        "module_utils/common/_http.py": "import http.client\nfrom urllib.error import URLError\n",
        "filter/ok.py": "from urllib.parse import urlsplit\nimport json\n",
    })
    allowed = {"module_utils/common/_http.py": (("http.client",), "the owner")}
    assert [v.split(" directly")[0] for v in violations(plugins, allowed)] == [
        "plugins/module_utils/engine/_fetch.py:2 uses requests",
        "plugins/module_utils/engine/_fetch.py:3 uses fetch_url()",
        "plugins/module_utils/transport/_scrape.py:1 uses http.client",
        "plugins/module_utils/transport/_scrape.py:2 uses ansible.module_utils.urls",
        "plugins/modules/probe.py:1 uses urllib.request",
        "plugins/modules/probe.py:2 uses urlopen()",
    ]
    fix = "send the request through common/_http.py (request, get_json, get_text, post_json, open_response)"
    assert all(v.endswith(fix) for v in violations(plugins, allowed))
