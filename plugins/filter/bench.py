# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the benchmark role's Kubernetes Jobs: where the tokenizer is on the node and in the pod."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs, _bench_job


def bench_tokenizer_paths(tokenizer, tokenizer_host_path, tokenizer_mount):
    """``{host, pod}`` of ``benchmark_tokenizer`` (``_bench_job.tokenizer_paths``, the rule benchmark_job renders
    the Jobs with): the staged revision on the node, and the client's path in the pod."""
    try:
        return _bench_job.tokenizer_paths(tokenizer, tokenizer_host_path, tokenizer_mount)
    except _bench_inputs.BenchError as e:
        raise AnsibleFilterError("bench_tokenizer_paths: %s" % e)


class FilterModule(object):
    def filters(self):
        return {"bench_tokenizer_paths": bench_tokenizer_paths}
