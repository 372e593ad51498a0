#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_job
short_description: Render a serving benchmark's rounds as Kubernetes Jobs running vllm bench serve in the cluster
version_added: "0.1.0"
description:
  - Reads the plan that M(llmops.serving.benchmark_plan) wrote into O(out_dir) and returns one C(batch/v1) Job per
    round, in plan order. Each runs the same client with the same flags as a local round (C(vllm bench serve) from
    C(vllm.benchmarks.serve), random dataset, exact lengths, greedy, C(--max-concurrency) C) and prints its saved
    result (per-request TTFT, ITL, latency, lengths, errors) on one C(LLMOPS_BENCH_RESULT) line of its log, which
    M(llmops.serving.benchmark_round) reads with O(llmops.serving.benchmark_round#module:client_output).
  - With O(render_dir) the Jobs are written there (C(NN-job-<name>.yaml) and a C(kustomization.yaml)); files of an
    earlier render that are no longer produced are removed.
options:
  out_dir:
    description: The directory holding C(plan.json).
    type: path
    required: true
  namespace:
    description: Namespace of the Jobs.
    type: str
    required: true
  image:
    description:
      - Image with vllm installed (its C(vllm.benchmarks.serve) is the client). The benchmark role passes the
        engine's image (C(engine_image)) unless C(benchmark_k8s_image) is set; an SGLang engine image has no vllm.
    type: str
    required: true
  python:
    description: Interpreter in the image.
    type: str
    default: python3
  tokenizer_host_path:
    description:
      - Node directory (hostPath, read-only) that holds the plan's tokenizer, the staging root (the benchmark role
        passes C(model_stage_dest_root)).
      - The plan's tokenizer may be given on the node (under this directory, as C(playbooks/benchmark.yml) does by
        default) or in the pod (under O(tokenizer_mount)); the client gets the pod's path. A tokenizer under
        neither fails with C(reason=tokenizer_path), naming C(benchmark_tokenizer).
    type: str
    default: /mnt/nvme/models
  tokenizer_mount:
    description: Where the Job mounts O(tokenizer_host_path); C(<tokenizer_host_path>/<name>/<revision>) is
      C(<tokenizer_mount>/<name>/<revision>) in the pod.
    type: str
    default: /models
  node_selector:
    description: Node selector of the Jobs (where the client runs).
    type: dict
    default: {}
  nodes:
    description:
      - Names (C(metadata.name), as C(kubectl get nodes) shows them) of the nodes whose local disk holds
        O(tokenizer_host_path) with the plan's tokenizer, for example the nodes that staged the model revision.
        Every Job gets a required node affinity to exactly these nodes, so its pod is never scheduled where the
        hostPath is missing (a hostPath of type C(Directory) fails at mount, after scheduling).
      - Empty places the Jobs on any node that fits (the tokenizer directory must then exist on every node).
    type: list
    elements: str
    default: []
  tolerations:
    description:
      - Tolerations of the Jobs, for the taints of O(nodes) (GPU nodes are often tainted); each names its taint key.
    type: list
    elements: dict
    default: []
  active_deadline:
    description: C(activeDeadlineSeconds) of each Job.
    type: int
    default: 3600
  header_secret:
    description:
      - Name of the Kubernetes Secret (in O(namespace)) that holds the targets' credential headers (C(Authorization),
        C(X-Api-Key), C(Cookie), a token-shaped value) as a JSON object under O(header_secret_key). The Jobs read
        it through C(valueFrom.secretKeyRef) into the client's environment; the value is never in a Job, a file
        or the result.
      - Required when a target of the plan sends a credential header (the module fails with
        C(reason=credential_header) otherwise); the other headers go in the Job's environment as they are.
    type: str
  header_secret_key:
    description: Key of O(header_secret) that holds the headers.
    type: str
    default: headers
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.render_dir
attributes:
  check_mode:
    support: full
    details: Reports the files a real run would write, writes none.
  diff_mode:
    support: full
    details: Shows each rendered file before and after.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Render the rounds as Jobs for GitOps
  llmops.serving.benchmark_job:
    out_dir: /var/tmp/llmops/bench
    namespace: llm
    image: vllm/vllm-openai:v0.10.1
    render_dir: /srv/gitops/bench
"""

RETURN = r"""
objects:
  description: The Jobs, in plan order.
  returned: always
  type: list
  elements: dict
names:
  description: The Jobs' names, in plan order (C(bench-NNN-<target>)).
  returned: always
  type: list
  elements: str
files:
  description: Files of the rendered directory (with O(render_dir)).
  returned: always
  type: list
  elements: str
changed_files:
  description: Files written or to be written (with O(render_dir)).
  returned: always
  type: list
  elements: str
removed:
  description: Files of an earlier render removed (with O(render_dir)).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs, _bench_job, _bench_outdir
from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks, _k8s_engine, _render_dir


class _SpecError(ValueError):
    secret_values = ()


def _render(params):
    if not (params["image"] or "").strip():
        raise _SpecError("image: empty; set benchmark_k8s_image (by default the engine's image, engine_image) to an "
                         "image with vllm installed, whose vllm.benchmarks.serve is the client")
    try:
        _k8s_checks.check_tolerations(params["tolerations"])
        nodes = _k8s_checks.check_staged_nodes(params["nodes"] or None, 1, field="nodes", what="the benchmark Job",
                                               hint="give the nodes that hold the tokenizer")
    except _k8s_checks.SpecError as e:
        raise _SpecError(str(e))
    try:
        plan = _bench_outdir.read_plan(params["out_dir"])
    except _bench_inputs.BenchError as e:
        raise _SpecError(str(e))
    affinity = _k8s_engine.pin_to_nodes({}, nodes) if nodes else None
    try:
        objects = [_bench_job.job_manifest(plan, r, params["namespace"], params["image"], python=params["python"],
                                           tokenizer_host_path=params["tokenizer_host_path"],
                                           tokenizer_mount=params["tokenizer_mount"],
                                           node_selector=params["node_selector"],
                                           active_deadline=params["active_deadline"], affinity=affinity,
                                           tolerations=params["tolerations"], header_secret=params["header_secret"],
                                           header_secret_key=params["header_secret_key"]) for r in plan["rounds"]]
    except _bench_inputs.BenchError as e:
        raise _SpecError(str(e))
    # the last net: the collection's one rule over the built Jobs (a credential in any field is refused)
    net = _secrets.Scan(env_field="env")
    net.objects(objects)
    net.refuse(_SpecError)
    return {"objects": objects, "names": [o["metadata"]["name"] for o in objects], "warnings": []}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            out_dir=dict(type="path", required=True),
            namespace=dict(type="str", required=True),
            image=dict(type="str", required=True),
            python=dict(type="str", default="python3"),
            tokenizer_host_path=dict(type="str", default="/mnt/nvme/models", no_log=False),
            tokenizer_mount=dict(type="str", default="/models", no_log=False),
            node_selector=dict(type="dict", default={}),
            nodes=dict(type="list", elements="str", default=[]),
            tolerations=dict(type="list", elements="dict", default=[]),
            active_deadline=dict(type="int", default=3600),
            header_secret=dict(type="str", no_log=False),  # a Secret's name, not a secret
            header_secret_key=dict(type="str", default="headers", no_log=False),
            **_render_dir.argument_spec(),
        ),
        supports_check_mode=True,
    )
    try:
        plan = _bench_outdir.read_plan(module.params["out_dir"])
    except _bench_inputs.BenchError:
        plan = None  # _render names the problem
    if plan is not None:
        # credential headers are never shown, and never put into a Job: they come from header_secret
        module.no_log_values.update(_bench_inputs.secret_header_values(plan["targets"]))
        try:
            _bench_job.check_header_secret(plan, module.params["header_secret"])
            _bench_job.tokenizer_paths(plan["tokenizer"], module.params["tokenizer_host_path"],
                                       module.params["tokenizer_mount"])
        except _bench_inputs.BenchError as e:
            module.fail_json(**_bench_inputs.failure(e))
    _render_dir.run_module(module, _render, _SpecError, (), always_list_files=True)


if __name__ == "__main__":
    main()
