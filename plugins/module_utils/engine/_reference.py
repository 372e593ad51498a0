# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: greedy reference generations computed by transformers itself.

The engine is judged against these: if vLLM serves the staged files correctly, its greedy tokens for the
same prompt equal transformers' own ``generate`` on the same directory. The generation runs in a separate
interpreter (the engine environment's Python), so the module needs neither torch nor transformers itself.
"""
from __future__ import annotations

import json
import subprocess
import sys

from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run

SCRIPT = r'''
import json, sys, time
t0 = time.monotonic()
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
req = json.loads(sys.stdin.read())
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(req["model_path"])
model = AutoModelForCausalLM.from_pretrained(req["model_path"], dtype=getattr(torch, req["dtype"]))
model.eval()
t_load = time.monotonic() - t0
eos = model.generation_config.eos_token_id
eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
results = []
with torch.no_grad():
    for prompt in req["prompts"]:
        enc = tok(prompt, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=req["max_new_tokens"], do_sample=False,
                             pad_token_id=tok.pad_token_id)
        gen = out[0][enc.input_ids.shape[1]:].tolist()
        results.append({"prompt": prompt, "prompt_token_ids": enc.input_ids[0].tolist(), "token_ids": gen,
                        "text": tok.decode([t for t in gen if t not in eos_ids], skip_special_tokens=True)})
print(json.dumps({"references": results, "load_seconds": round(t_load, 3),
                  "generate_seconds": round(time.monotonic() - t0 - t_load, 3),
                  "library_versions": {"torch": torch.__version__, "transformers": transformers.__version__}}))
'''


class ReferenceError_(Exception):
    """The reference run failed; the message carries the interpreter's error output."""


def greedy_reference(model_path, prompts, max_new_tokens=16, dtype="float32", python=None, timeout=900):
    """Return ``{references: [{prompt, prompt_token_ids, token_ids, text}], load_seconds, ...}``."""
    req = json.dumps({"model_path": model_path, "prompts": list(prompts), "max_new_tokens": int(max_new_tokens),
                      "dtype": dtype})
    python = python or sys.executable
    try:
        # the last output line is parsed by the shared reader (size, nesting, finite numbers)
        out = _process_run.python_json(python, SCRIPT, stdin=req, timeout=timeout)
    except _process_run.PythonFailed as e:
        raise ReferenceError_("reference generation with %s exited %d: %s" % (python, e.returncode, e.stderr[-1500:]))
    except subprocess.TimeoutExpired:
        raise ReferenceError_("reference generation with %s did not finish within %s s; raise the timeout or use a "
                              "smaller model" % (python, timeout))
    except OSError as e:
        raise ReferenceError_("python: cannot run %s (%s); point python at the engine environment's interpreter"
                              % (python, e.strerror or e.__class__.__name__))
    except ValueError as e:
        raise ReferenceError_("reference generation with %s printed no usable result (%s); point python at an "
                              "interpreter with torch and transformers" % (python, e))
    if not isinstance(out, dict) or not isinstance(out.get("references"), list):
        raise ReferenceError_("reference generation with %s printed JSON without a list of references; point python "
                              "at an interpreter with torch and transformers" % python)
    # keys a module result reserves are not taken from the interpreter's output
    return dict((k, v) for k, v in out.items() if k not in ("changed", "failed", "msg", "invocation"))
