"""Stand-in for the engine's warm-up: writes a Triton-style cache entry where TRITON_CACHE_DIR points.

A real warm-up starts the engine so that it compiles its kernels; the role only needs a command that fills
the cache variables it exports. Each run appends one byte to the file named by argv[1], so the scenario can
prove the cache was built once and reused by the idempotence run.
"""
import json
import os
import sys

with open(sys.argv[1], "a") as f:
    f.write("x")
d = os.path.join(os.environ["TRITON_CACHE_DIR"], "KEY")
os.makedirs(d)
with open(os.path.join(d, "k.cubin"), "wb") as f:
    f.write(b"\x7fELF" * 256)
with open(os.path.join(d, "__grp__k.json"), "w") as f:
    json.dump({"child_paths": {"k.cubin": os.path.join(d, "k.cubin")}}, f)
