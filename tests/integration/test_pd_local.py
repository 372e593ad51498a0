"""A real prefill/decode pair on this host: two vLLM CPU engines with NixlConnector over UCX TCP, the
collection's P/D proxy, and playbooks/verify_transport.yml proving what carried the KV cache.

Ports 18100-18102 (prefill, decode, proxy) and 18150-18151 (NIXL side channels).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.dirname(sys.executable)
PYCOLL = os.path.join(ROOT, ".build", "pycoll")  # the working tree as ansible_collections/llmops/serving
PROXY, DECODE, PREFILL = 18102, 18101, 18100


def _env(llmops_root):
    env = dict(os.environ)
    env.update(ANSIBLE_COLLECTIONS_PATH=PYCOLL, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               LLMOPS_ROOT=str(llmops_root), ANSIBLE_NOCOLOR="1", PATH=VENV_BIN + os.pathsep + env["PATH"])
    return env


def _ansible(args, llmops_root, timeout=1200):
    cmd = [os.path.join(VENV_BIN, args[0])] + args[1:] + [
        "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable]
    return subprocess.run(cmd, cwd=ROOT, env=_env(llmops_root), capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def pd_pair(tmp_path_factory):
    from ansible_collections.llmops.serving.plugins.module_utils.engine._demo_model import generate_model

    base = tmp_path_factory.mktemp("pd")
    model = generate_model(str(base / "models"), name="tiny-llama", seed=0)
    root = base / "llmops"
    common = ["-e", "pd_disagg_platform=local", "-e", "pd_disagg_local_model_path=%s" % model["path"],
              "-e", "pd_disagg_local_python=%s" % sys.executable,
              # an inventory of one ungrouped host: name it (the plays default to the prefill and decode groups)
              "-e", "pd_verify_hosts=localhost",
              # eager mode (no torch.compile at each engine start, as the other engine tests run it): what is tested
              # here (NIXL over UCX, the proxy's route, the counters, the verdict) does not depend on it
              "-e", json.dumps({"pd_disagg_engine_extra_args": ["--enforce-eager"]})]
    role_play = base / "role.yml"
    role_play.write_text(
        "- name: The pd_disagg role alone\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  roles:\n"
        "    - role: llmops.serving.pd_disagg\n"
        "      vars: {pd_disagg_platform: local}\n")
    yield {"root": root, "common": common, "model": model, "role_play": str(role_play)}
    # Stop through the role itself (pd_state=absent), whatever the tests did.
    stop = _ansible(["ansible-playbook", str(role_play), "-e", "pd_disagg_state=absent"], root, timeout=300)
    assert stop.returncode == 0, stop.stdout[-3000:] + stop.stderr[-2000:]


def _verify(pd_pair, transport, extra=()):
    return _ansible(["ansible-playbook", "playbooks/verify_transport.yml", "-e", "pd_disagg_transport=" + transport,
                     "-e", "pd_verify_reference_url=http://127.0.0.1:%d" % PREFILL] + pd_pair["common"] + list(extra),
                    pd_pair["root"])


def test_tcp_round_proves_kv_moved_over_nixl_and_not_rdma(pd_pair):
    run = _verify(pd_pair, "tcp")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    with open(pd_pair["root"] / "evidence" / "transport-tcp-localhost.json") as f:
        ev = json.load(f)
    # P/D output equals the colocated greedy output for every prompt.
    assert ev["load"]["completed"] == 4 and ev["load"]["all_match"] is True
    assert all(r["route"]["prefill-target-pod-ip"] == "127.0.0.1:%d" % PREFILL for r in ev["load"]["requests"])
    assert all(r["route"]["target-pod-ip"] == "127.0.0.1:%d" % DECODE for r in ev["load"]["requests"])
    # NIXL bytes grew on decode, with zero failed transfers; decode received every prompt token.
    kv = ev["kv"]
    assert kv["baseline"] is True and kv["bytes"] > 0 and kv["transfers"] == 4 and kv["failures"] == 0
    assert kv["rate_bytes_per_s"] > 0
    assert kv["prompt_tokens_by_source"]["external_kv_transfer"] > 0
    assert kv["prompt_tokens_by_source"]["local_compute"] == 0
    # No RDMA port moved; on this host there is none, and the verdict says so.
    assert ev["verdict"]["passed"] is True and ev["rdma_present"] is False
    assert "no RDMA devices" in ev["verdict"]["summary"]
    assert ev["deltas"]["totals"] == {"tx_bytes": 0, "rx_bytes": 0, "tx_packets": 0, "rx_packets": 0}


def _empty_baseline():
    """A baseline of this host with no RDMA ports (schema 2 records the host and the port set it covered)."""
    host = {"boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
            "hostname": open("/proc/sys/kernel/hostname").read().strip()}
    return {"schema": 2, "taken_at": 0, "host": host, "selection": {"devices": [], "ports": []}, "ports": {}}


def test_rdma_expectation_fails_on_this_host_and_says_why(pd_pair):
    run = subprocess.run(
        [os.path.join(VENV_BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", "llmops.serving.rdma_counters",
         "-a", json.dumps({"baseline": _empty_baseline(), "expect": "rdma",
                           "nixl_metrics": "http://127.0.0.1:%d/metrics" % DECODE})],
        cwd=ROOT, env=_env(pd_pair["root"]), capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "expect rdma: FAIL" in out and "no RDMA devices" in out


def test_role_is_idempotent_while_the_pair_runs(pd_pair):
    # the role alone, as verify_transport.yml's first play runs it (the measurement above need not run twice)
    again = _ansible(["ansible-playbook", pd_pair["role_play"], "-e", "pd_disagg_transport=tcp"] + pd_pair["common"],
                     pd_pair["root"])
    assert again.returncode == 0, again.stdout[-4000:]
    # engine_process left all three processes alone (same command and environment).
    assert "Start the prefill and decode engines" in again.stdout
    section = again.stdout.split("TASK [llmops.serving.pd_disagg : Start the prefill and decode engines]")[1]
    section = section.split("TASK [")[0]
    assert "changed:" not in section and section.count("ok:") == 2
