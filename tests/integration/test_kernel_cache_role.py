"""The kernel_cache role through ansible-playbook: build once, restore, rebuild after tampering, canary +
store, argument_specs rejections. The warm-up is a small script that writes Triton-style cache entries,
so no engine is needed."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)

WARMUP = r"""
import hashlib, json, os, sys
with open(sys.argv[1], "a") as f:
    f.write("x")
if os.environ.get("HF_TOKEN"):
    with open(sys.argv[1] + ".token", "w") as f:
        f.write(hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest())
d = os.path.join(os.environ["TRITON_CACHE_DIR"], "KEY")
os.makedirs(d)
with open(os.path.join(d, "k.cubin"), "wb") as f:
    f.write(b"\x7fELF" * 256)
with open(os.path.join(d, "__grp__k.json"), "w") as f:
    json.dump({"child_paths": {"k.cubin": os.path.join(d, "k.cubin")}}, f)
"""

PLAY = """
- name: Kernel cache
  hosts: all
  gather_facts: false
  roles:
    - role: llmops.serving.kernel_cache
  post_tasks:
    - name: Save the facts the engine role gets
      ansible.builtin.copy:
        dest: "{{ out_file }}"
        mode: "0644"
        content: "{{ {'env': kernel_cache_env, 'dir': kernel_cache_dir, 'fp': kernel_cache_fingerprint,
                     'status': kernel_cache_status, 'engine_dir': kernel_cache_engine_dir} | to_json }}"
      delegate_to: localhost
"""


@pytest.fixture(scope="module")
def pycoll(tmp_path_factory):
    tree = tmp_path_factory.mktemp("pycoll")
    os.makedirs(str(tree / "ansible_collections" / "llmops"))
    os.symlink(ROOT, str(tree / "ansible_collections" / "llmops" / "serving"))
    return str(tree)


@pytest.fixture
def setup(tmp_path, pycoll):
    model = tmp_path / "models" / "m" / "rev1"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "warmup.py").write_text(WARMUP)
    (tmp_path / "play.yml").write_text(PLAY)
    return tmp_path


def play(tmp_path, pycoll, extra, hosts=("localhost",), out="facts", options=()):
    inv = tmp_path / "inventory.ini"
    inv.write_text("".join("%s ansible_connection=local ansible_python_interpreter=%s\n" % (h, sys.executable)
                           for h in hosts))
    base = {
        "kernel_cache_root": str(tmp_path / "nvme" / "kc"),
        "kernel_cache_model_path": str(tmp_path / "models" / "m" / "rev1"),
        "kernel_cache_model_revision": "rev1",
        "kernel_cache_engine_python": sys.executable,
        "kernel_cache_warmup_command": [sys.executable, str(tmp_path / "warmup.py"), str(tmp_path / "runs.txt")],
        "out_file": str(tmp_path / (out + "-{{ inventory_hostname }}.json")),
    }
    base.update(extra)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=pycoll, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", str(inv), str(tmp_path / "play.yml"),
                           "-e", json.dumps(base)] + list(options), capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    return proc


def facts(tmp_path, host="localhost", out="facts"):
    with open(str(tmp_path / ("%s-%s.json" % (out, host)))) as f:
        return json.load(f)


def runs(tmp_path):
    p = tmp_path / "runs.txt"
    return len(p.read_text()) if p.exists() else 0


def test_build_once_then_restore_then_rebuild_after_tamper(setup, pycoll):
    p = play(setup, pycoll, {"kernel_cache_mount_path": "/cache"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    f = facts(setup)
    assert f["status"] == "hit" and runs(setup) == 1
    assert f["env"]["TRITON_CACHE_DIR"] == "/cache/triton" and f["env"]["VLLM_CACHE_ROOT"] == "/cache/torch_compile"
    assert f["dir"] == str(setup / "nvme" / "kc" / "vllm" / f["fp"])
    # the engine gets its own copy, relocated to the mount path; the published directory is left as published
    assert f["engine_dir"] == str(setup / "nvme" / "kc" / "vllm" / ".run" / (f["fp"] + "-engine"))
    grp = os.path.join(f["engine_dir"], "triton", "KEY", "__grp__k.json")
    assert json.load(open(grp))["child_paths"]["k.cubin"] == "/cache/triton/KEY/k.cubin"
    published = os.path.join(f["dir"], "triton", "KEY", "__grp__k.json")
    assert json.load(open(published))["child_paths"]["k.cubin"] == os.path.join(f["dir"], "triton", "KEY", "k.cubin")
    # second run: restored, nothing rebuilt, nothing changed
    p = play(setup, pycoll, {"kernel_cache_mount_path": "/cache"})
    assert p.returncode == 0 and runs(setup) == 1 and facts(setup)["fp"] == f["fp"]
    assert "changed=0" in p.stdout, p.stdout[-3000:]
    # tampered kernel: quarantined and rebuilt
    with open(os.path.join(f["dir"], "triton", "KEY", "k.cubin"), "r+b") as fh:
        fh.write(b"EVIL")
    p = play(setup, pycoll, {"kernel_cache_mount_path": "/cache"})
    assert p.returncode == 0, p.stdout[-3000:]
    assert runs(setup) == 2 and os.listdir(str(setup / "nvme" / "kc" / ".quarantine"))
    # a changed kernel-affecting argument is a new fingerprint, built separately
    p = play(setup, pycoll, {"kernel_cache_engine_args": ["--max-num-batched-tokens", "4096"]})
    assert p.returncode == 0 and runs(setup) == 3 and facts(setup)["fp"] != f["fp"]


def test_canary_builds_others_copy_from_store(setup, pycoll):
    hosts = ("node-a", "node-b")
    extra = {"kernel_cache_store_root": str(setup / "shared" / "store"), "kernel_cache_canary": "node-a",
             "kernel_cache_root": str(setup / "nvme-{{ inventory_hostname }}")}
    p = play(setup, pycoll, extra, hosts=hosts)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert runs(setup) == 1
    a, b = facts(setup, "node-a"), facts(setup, "node-b")
    assert a["fp"] == b["fp"] and a["status"] == b["status"] == "hit"
    assert b["dir"].startswith(str(setup / "nvme-node-b"))
    grp = os.path.join(b["dir"], "triton", "KEY", "__grp__k.json")
    assert json.load(open(grp))["child_paths"]["k.cubin"].startswith(b["dir"] + "/")
    grp = os.path.join(b["engine_dir"], "triton", "KEY", "__grp__k.json")
    assert json.load(open(grp))["child_paths"]["k.cubin"].startswith(b["engine_dir"] + "/")
    assert b["env"]["TRITON_CACHE_DIR"] == b["engine_dir"] + "/triton"


@pytest.mark.parametrize("extra,needle", [
    ({"kernel_cache_engine": "trt"}, "kernel_cache_engine"),
    ({"kernel_cache_model_path": None}, "kernel_cache_model_path"),
    ({"kernel_cache_warmup_mode": "forever"}, "kernel_cache_warmup_mode"),
    ({"kernel_cache_keep": "many"}, "kernel_cache_keep"),
])
def test_argument_specs_reject_bad_input(setup, pycoll, extra, needle):
    extra = dict(extra)
    if extra.get("kernel_cache_model_path", "") is None:
        extra = {"kernel_cache_model_path": ""}
        needle = "model_path"
    p = play(setup, pycoll, extra)
    assert p.returncode != 0
    assert needle in p.stdout + p.stderr
    assert not os.path.exists(str(setup / "nvme" / "kc" / "vllm")) or not [
        d for d in os.listdir(str(setup / "nvme" / "kc" / "vllm")) if not d.startswith(".")]
    assert runs(setup) == 0


def test_warmup_env_values_never_reach_the_output_even_at_vvv(setup, pycoll):
    secret = "hf_role7Qz9secretTokenValue"
    p = play(setup, pycoll, {"kernel_cache_warmup_env": {"HF_TOKEN": secret}}, options=["-vvv"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert runs(setup) == 1
    with open(str(setup / "runs.txt.token")) as f:
        assert f.read() == hashlib.sha256(secret.encode()).hexdigest()  # the warm-up got it
    assert secret not in p.stdout + p.stderr
