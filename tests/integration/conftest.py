"""One real vLLM CPU engine for the whole integration session, started by playbooks/site.yml itself.

The engine listens on LLMOPS_TEST_PORT (default 18001) under a temporary LLMOPS_ROOT, so a running
``make demo`` (port 8000, /var/tmp/llmops) is never touched.
"""
from __future__ import annotations

import os

import pytest

from llmops_testlib import run_playbook


@pytest.fixture(scope="session")
def local_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("llmops-root")
    port = int(os.environ.get("LLMOPS_TEST_PORT", "18001"))
    rc, out = run_playbook("playbooks/site.yml", root, port)
    info = {"root": str(root), "port": port, "base_url": "http://127.0.0.1:%d" % port, "model": "tiny-llama",
            "first_rc": rc, "first_output": out, "run_dir": os.path.join(str(root), "run")}
    yield info
    run_playbook("playbooks/stop.yml", root, port, timeout=300)
