"""Every HTTP request of the collection is bounded: it goes through ``common/_http.py``, whose timeout is a deadline
for the whole answer and whose ``max_bytes`` caps the body while it is read (docs/development.md, "Where each idea
lives"). A file under ``plugins/`` that imports an HTTP client itself (``urllib.request``, ``http.client``,
``ansible.module_utils.urls``, ``requests``, ``urllib3``, ``httpx``, ``aiohttp``) or calls one (``urlopen``,
``open_url``, ``fetch_url``, ``HTTPConnection``) would read an answer without either bound, so it is named here
unless :data:`ALLOWED` names it with its owner and why. So is a file that opens a TCP connection itself
(``socket.create_connection``, ``socket.socket``): that is how a client of its own is written without importing one,
and the peer fan-out's wire is one (bounded by its own reader, allowed below with the reason)."""
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
#: ``socket.<name>()`` calls that open a connection: a client written on the socket itself.
SOCKETS = ("socket.create_connection()", "socket.socket()")

#: file under plugins/ -> (the clients it may import, its owner and why it is not a bypass).
ALLOWED = {
    "module_utils/common/_http.py": (
        ("urllib.request", "http.client", "ansible.module_utils.urls"),
        "the one client (common): the deadline and the cap live here"),
    "module_utils/kube/_k8s_client.py": (
        ("urllib3",),
        "kube: configures the kubernetes client's transport (proxy headers, certificate warnings); it sends "
        "nothing itself"),
    "module_utils/engine/_probe.py": (
        ("socket.create_connection()",),
        "engine: port_open() connects and closes (the port_open milestone of the probe's timeline); it sends "
        "and reads nothing"),
    "module_utils/stage/_stage_fanout_wire.py": (
        ("socket.create_connection()",),
        "stage: the peer fan-out's HTTP/1.1 client (PeerClient), one persistent connection per stream and peer: "
        "the answer head is bounded (MAX_ANSWER_HEAD bytes, MAX_ANSWER_HEADERS lines), bodies are Content-Length "
        "only, lists are read under PIECES_MAX_BYTES and pieces into their buffer, every request has a whole-answer "
        "deadline from the one deadline thread (test_stage_fanout_wire_client.py); not through _http.py, whose "
        "connection and reader thread per request cost more CPU than the transfer (docs/benchmarks/fanout.md)"),
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
            elif (isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "socket"
                  and "socket.%s()" % fn.attr in SOCKETS):
                out.append((node.lineno, "socket.%s()" % fn.attr))
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
                if what in may or (what.endswith("()") and what not in SOCKETS and rel in allowed):
                    continue
                if what in SOCKETS:
                    bad.append("plugins/%s:%d opens a connection itself (%s): a client of its own has no deadline "
                               "and no size cap unless it is written and tested as one; send the request through "
                               "common/_http.py, or name the file in ALLOWED with how it is bounded" % (rel, line, what))
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
        assert clients and why and all(c in CLIENTS + SOCKETS for c in clients), rel


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


def test_a_client_written_on_a_socket_is_named_unless_allowed_with_how_it_is_bounded(tmp_path):
    """The fan-out's wire no longer imports http.client: a raw-socket client is caught by the connection it opens."""
    plugins = _tree(tmp_path, {
        "module_utils/stage/_wire.py": "import socket\ns = socket.create_connection(('h', 1))\ns.sendall(b'GET / HTTP/1.1')\n",
        "module_utils/transport/_raw.py": "import socket\nsocket.socket().connect(('h', 1))\n",
        "module_utils/common/_http.py": "import http.client\n",
        "module_utils/engine/_ok.py": "import socket\nsocket.gethostname()\n",
    })
    allowed = {"module_utils/common/_http.py": (("http.client",), "the owner")}
    got = violations(plugins, allowed)
    assert [v.split(" opens")[0] for v in got] == ["plugins/module_utils/stage/_wire.py:2",
                                                   "plugins/module_utils/transport/_raw.py:2"]
    assert all("(socket." in v and "name the file in ALLOWED with how it is bounded" in v for v in got)
    # allowed for exactly the call it names; being in ALLOWED for something else is not enough
    allowed["module_utils/stage/_wire.py"] = (("socket.create_connection()",), "its own bounded reader")
    allowed["module_utils/transport/_raw.py"] = (("http.client",), "something else")
    assert [v.split(" opens")[0] for v in violations(plugins, allowed)] == ["plugins/module_utils/transport/_raw.py:2"]
