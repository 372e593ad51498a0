"""Helpers shared by the integration tests: run this repo's playbooks on inventories/local."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, ".build", "collections")
#: The demo engine started cheaply, for tests whose point is the engine's lifecycle (started, replaced, started again)
#: and not its compile: eager, the engine core and its worker in the API server's process, so a start costs the
#: interpreter's imports and the model's load only (13 s against 21-22 s with inventories/local's settings, quiet).
EAGER_ENGINE = {
    "engine_local_env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                         "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "engine_local_args": ["--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni"],
}


def ansible_env(llmops_root, port, **extra):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": COLLECTIONS,
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "LLMOPS_ROOT": str(llmops_root),
        "LLMOPS_ENGINE_PORT": str(port),
    })
    env.update(extra)
    return env


def run_playbook(playbook, llmops_root, port, *args, timeout=1800, inventory=None):
    """Run a playbook of this repo on inventories/local; returns (rc, output)."""
    if not os.path.isdir(os.path.join(COLLECTIONS, "ansible_collections", "llmops", "serving")):
        pytest.fail("the collection is not installed under .build/collections: run `make install` first")
    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, "ansible-playbook"), os.path.join(ROOT, playbook), "-i",
           inventory or os.path.join(ROOT, "inventories", "local")] + list(args)
    proc = subprocess.run(cmd, cwd=ROOT, env=ansible_env(llmops_root, port), capture_output=True, text=True,
                          timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def recap(output):
    """{'ok': n, 'changed': n, 'failed': n, ...} of the localhost line of PLAY RECAP."""
    m = re.search(r"localhost\s*:\s*(ok=.*)", output)
    assert m, "no PLAY RECAP in output:\n" + output[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
