# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a tiny, deterministic Llama checkpoint generated offline.

Everything is derived from the inputs: the same name/seed/shape on the same library versions gives
bit-identical files, and the revision is the content hash, so a changed generator is a new revision
rather than a silent overwrite. Needs numpy, safetensors and tokenizers (imported lazily).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, read_bytes

CORPUS = """\
The model is staged from the shared filesystem to local storage once and verified before it is served.
A correct answer is the only readiness signal that counts; an open port proves nothing about the weights.
Prefill computes the prompt, decode produces one token at a time, and the cache moves between them.
Every rank loads its slice of the weights, and the slowest rank decides when the server is ready.
The quick brown fox jumps over the lazy dog while the server answers the first request of the day.
Kernels are compiled once for a version, a device and a shape, and a cache is never shared across versions.
Small models make fast tests; large models make long nights; careful automation makes both repeatable.
One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen.
"""

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def tensor_specs(vocab, hidden, inter, layers):
    """Names and shapes of a Llama causal LM (separate lm_head, no tied embeddings)."""
    specs = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = "model.layers.%d." % i
        specs += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.k_proj.weight", (hidden, hidden)),
            (p + "self_attn.v_proj.weight", (hidden, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    specs += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return specs


def build_tokenizer(vocab_size):
    """Byte-level BPE trained offline on CORPUS; returns (tokenizer_json_str, actual_vocab_size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return tok.to_str(), tok.get_vocab_size()


def _json_bytes(obj):
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def build_files(seed=0, vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                num_heads=2, num_shards=3, max_position_embeddings=1024):
    """Return {relative file name: bytes} for the whole checkpoint."""
    import numpy as np
    from safetensors.numpy import save

    if hidden_size % num_heads:
        raise ValueError("hidden_size %d is not divisible by num_heads %d" % (hidden_size, num_heads))
    if num_shards < 1:
        raise ValueError("num_shards must be >= 1")
    tok_json, vocab = build_tokenizer(vocab_size)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "head_dim": hidden_size // num_heads,
        "num_hidden_layers": num_layers,
        "vocab_size": vocab,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in tensor_specs(vocab, hidden_size, intermediate_size, num_layers):
        if name.endswith("norm.weight"):
            arr = np.ones(shape, dtype=np.float32)
        else:
            std = 1.0 if "embed_tokens" in name else (0.2 if name == "lm_head.weight" else 0.05)
            arr = (rng.standard_normal(shape) * std).astype(np.float32)
        tensors[name] = arr
    names = [spec[0] for spec in tensor_specs(vocab, hidden_size, intermediate_size, num_layers)]
    # Contiguous groups of tensors, one group per shard, balanced by bytes.
    total = sum(tensors[n].nbytes for n in names)
    target = total / float(num_shards)
    groups, cur, acc = [], [], 0
    for n in names:
        cur.append(n)
        acc += tensors[n].nbytes
        if acc >= target * (len(groups) + 1) and len(groups) < num_shards - 1:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    files = {}
    weight_map = {}
    for i, group in enumerate(groups):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(groups))
        files[fname] = save({n: tensors[n] for n in group}, metadata={"format": "pt"})
        for n in group:
            weight_map[n] = fname
    files["model.safetensors.index.json"] = _json_bytes(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    files["config.json"] = _json_bytes(config)
    files["generation_config.json"] = _json_bytes({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False})
    files["tokenizer.json"] = tok_json.encode("utf-8")
    files["tokenizer_config.json"] = _json_bytes({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>",
        "model_max_length": max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    })
    files["special_tokens_map.json"] = _json_bytes(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"})
    sums = "".join("%s  %s\n" % (hashlib.sha256(files[f]).hexdigest(), f) for f in sorted(files))
    files["SHA256SUMS"] = sums.encode("utf-8")
    return files


def revision_of(files):
    """Content-derived revision: the first 12 hex of sha256(SHA256SUMS)."""
    return hashlib.sha256(files["SHA256SUMS"]).hexdigest()[:12]


def _regular_size(path):
    """Size of a regular file reached without a symlink, else None."""
    st = os.lstat(path)
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def generate_model(models_root, name="tiny-llama", seed=0, check_mode=False, **shape):
    """Write the checkpoint to ``<models_root>/<name>/<revision>`` atomically; idempotent.

    Returns a dict: ``path``, ``revision``, ``changed``, ``files`` (sorted), ``bytes``.
    """
    files = build_files(seed=seed, **shape)
    revision = revision_of(files)
    model_dir = os.path.join(models_root, name)
    dest = os.path.join(model_dir, revision)
    info = {
        "path": dest,
        "revision": revision,
        "name": name,
        "files": sorted(files),
        "bytes": sum(len(b) for b in files.values()),
        "changed": False,
    }
    sums_path = os.path.join(dest, "SHA256SUMS")
    if os.path.isdir(dest):
        try:
            # the shared reader: a FIFO or a device in the manifest's place is "not this revision" (it is
            # written again), never a hang; nothing longer than the expected manifest is read
            same = read_bytes(sums_path, max_bytes=len(files["SHA256SUMS"]), follow=False) == files["SHA256SUMS"]
            if same and all(_regular_size(os.path.join(dest, fn)) == len(b) for fn, b in files.items()):
                return info
        except (OSError, UntrustedInput):
            pass
    info["changed"] = True
    if check_mode:
        return info
    os.makedirs(model_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".partial-%s-" % revision, dir=model_dir)
    try:
        for fn, data in files.items():
            with open(os.path.join(tmp, fn), "wb") as f:
                f.write(data)
        os.chmod(tmp, 0o755)
        if os.path.isdir(dest):  # incomplete or tampered copy of the same revision: replace it
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info
