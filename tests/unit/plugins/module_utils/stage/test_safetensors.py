"""Header/index verification on hand-built good and broken safetensors files."""
from __future__ import annotations

import json
import struct

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors as st
from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang as _no_hang


def build(tensors, pad_header=0, trailing=b"", raw_header=None):
    """tensors: name -> (dtype, shape, nbytes). Returns the bytes of a safetensors file."""
    header, data, off = {}, b"", 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        data += bytes((off + i) % 251 for i in range(nbytes))
        off += nbytes
    header["__metadata__"] = {"format": "pt"}
    hb = raw_header if raw_header is not None else json.dumps(header).encode()
    hb += b" " * pad_header
    return struct.pack("<Q", len(hb)) + hb + data + trailing


GOOD = {"a": ("F32", [2, 3], 24), "b": ("BF16", [4], 8), "c": ("F8_E4M3", [5], 5), "d": ("F4", [4], 2)}


def write(tmp_path, name, blob):
    p = tmp_path / name
    p.write_bytes(blob)
    return str(p)


def test_good_file_lists_tensors_and_sizes(tmp_path):
    path = write(tmp_path, "m.safetensors", build(GOOD, pad_header=3))
    summary, raw = st.verify_file(path)
    assert summary["tensors"] == ["a", "b", "c", "d"]
    assert summary["data_bytes"] == 24 + 8 + 5 + 2
    assert raw.startswith(b"{")


def test_truncated_file_is_reported_with_sizes(tmp_path):
    blob = build(GOOD)
    path = write(tmp_path, "m.safetensors", blob[:-1])
    with pytest.raises(st.CheckpointError) as e:
        st.verify_file(path)
    assert e.value.path == path
    assert "truncated" in e.value.reason and str(len(blob)) in e.value.reason


def test_trailing_bytes_are_rejected(tmp_path):
    path = write(tmp_path, "m.safetensors", build(GOOD, trailing=b"xx"))
    with pytest.raises(st.CheckpointError, match="trailing bytes"):
        st.verify_file(path)


def test_header_length_past_end_of_file(tmp_path):
    path = write(tmp_path, "m.safetensors", struct.pack("<Q", 10 ** 6) + b"{}")
    with pytest.raises(st.CheckpointError, match="header length 1000000 points past end of file"):
        st.verify_file(path)


def test_header_length_over_limit(tmp_path):
    path = write(tmp_path, "m.safetensors", struct.pack("<Q", st.MAX_HEADER_BYTES + 1) + b"{}")
    with pytest.raises(st.CheckpointError, match="exceeds"):
        st.verify_file(path)


def test_file_shorter_than_length_prefix(tmp_path):
    path = write(tmp_path, "m.safetensors", b"\x01\x02")
    with pytest.raises(st.CheckpointError, match="shorter than the 8-byte"):
        st.verify_file(path)


def test_garbage_json_header(tmp_path):
    path = write(tmp_path, "m.safetensors", build({}, raw_header=b"{not json"))
    with pytest.raises(st.CheckpointError, match="not valid UTF-8 JSON"):
        st.verify_file(path)


def test_duplicate_tensor_names(tmp_path):
    hb = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    path = write(tmp_path, "m.safetensors", struct.pack("<Q", len(hb)) + hb + b"\0")
    with pytest.raises(st.CheckpointError, match="duplicate key"):
        st.verify_file(path)


def test_span_not_matching_shape_times_dtype(tmp_path):
    blob = build({"w": ("F16", [3, 3], 17)})  # needs 18
    path = write(tmp_path, "m.safetensors", blob)
    with pytest.raises(st.CheckpointError, match=r"tensor w: data_offsets span 17 bytes but shape \[3, 3\] x F16 needs 18"):
        st.verify_file(path)


def test_unknown_dtype_and_bad_shape(tmp_path):
    path = write(tmp_path, "a.safetensors", build({"w": ("Q7", [1], 1)}))
    with pytest.raises(st.CheckpointError, match="unknown dtype 'Q7'"):
        st.verify_file(path)
    path = write(tmp_path, "b.safetensors", build({"w": ("U8", [-1], 0)}))
    with pytest.raises(st.CheckpointError, match="non-negative"):
        st.verify_file(path)


def test_sub_byte_dtype_must_fill_whole_bytes(tmp_path):
    path = write(tmp_path, "m.safetensors", build({"w": ("F4", [3], 2)}))
    with pytest.raises(st.CheckpointError, match="not a whole number of bytes"):
        st.verify_file(path)


def test_overlapping_tensors(tmp_path):
    hb = json.dumps({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                     "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}).encode()
    path = write(tmp_path, "m.safetensors", struct.pack("<Q", len(hb)) + hb + b"\0" * 6)
    with pytest.raises(st.CheckpointError, match="tensor b overlaps tensor a"):
        st.verify_file(path)


def test_bad_metadata_type(tmp_path):
    hb = json.dumps({"__metadata__": {"x": 1}}).encode()
    path = write(tmp_path, "m.safetensors", struct.pack("<Q", len(hb)) + hb)
    with pytest.raises(st.CheckpointError, match="__metadata__"):
        st.verify_file(path)


def _index(tmp_path, wmap):
    p = tmp_path / st.INDEX_NAME
    p.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wmap}))
    return str(p)


def test_index_consistent_with_shards(tmp_path):
    path = _index(tmp_path, {"a": "s1.safetensors", "b": "s2.safetensors"})
    st.check_index(path, st.load_index(path), {"s1.safetensors": {"a"}, "s2.safetensors": {"b", "x"}})


def test_index_tensor_missing_from_its_shard(tmp_path):
    path = _index(tmp_path, {"a": "s1.safetensors", "b": "s1.safetensors"})
    with pytest.raises(st.CheckpointError) as e:
        st.check_index(path, st.load_index(path), {"s1.safetensors": {"a"}})
    assert e.value.path.endswith("s1.safetensors")
    assert "tensor b is missing from its shard" in e.value.reason


def test_index_names_missing_shard(tmp_path):
    path = _index(tmp_path, {"a": "s9.safetensors"})
    with pytest.raises(st.CheckpointError, match="missing shard"):
        st.check_index(path, st.load_index(path), {"s1.safetensors": {"a"}})


def test_index_without_weight_map(tmp_path):
    p = tmp_path / st.INDEX_NAME
    p.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(st.CheckpointError, match="weight_map"):
        st.load_index(str(p))


def test_files_written_by_the_safetensors_library_pass(tmp_path):
    torch = pytest.importorskip("torch")
    save_file = pytest.importorskip("safetensors.torch").save_file
    path = str(tmp_path / "lib.safetensors")
    save_file({"w": torch.zeros((3, 5), dtype=torch.bfloat16), "b": torch.ones(7, dtype=torch.float32),
               "e": torch.zeros((0, 4), dtype=torch.int64)}, path)
    summary, _raw = st.verify_file(path)
    assert summary["tensors"] == ["b", "e", "w"]


# Upstream rules restated here: huggingface/safetensors safetensors/src/tensor.rs (Metadata::validate:
# InvalidOffset when a tensor does not start where the previous ended; MetadataIncompleteBuffer when the
# tensors do not cover the whole buffer; InvalidHeaderStart when the header is not a JSON object).

def test_hole_between_tensors_is_refused_like_safe_open(tmp_path):
    header = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
              "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}
    hb = json.dumps(header).encode()
    path = write(tmp_path, "hole.safetensors", struct.pack("<Q", len(hb)) + hb + b"\1" * 12)
    with pytest.raises(st.CheckpointError, match="hole of 4 bytes"):
        st.verify_file(path)


def test_hole_before_the_first_tensor_is_refused(tmp_path):
    header = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}
    hb = json.dumps(header).encode()
    path = write(tmp_path, "lead.safetensors", struct.pack("<Q", len(hb)) + hb + b"\1" * 8)
    with pytest.raises(st.CheckpointError, match="hole"):
        st.verify_file(path)


@pytest.mark.parametrize("nest", ["[" * 20000 + "]" * 20000, '{"a":' * 20000 + "1" + "}" * 20000])
def test_nested_json_bomb_is_a_clean_error(tmp_path, nest):
    hb = ('{"x": %s}' % nest).encode()
    path = write(tmp_path, "bomb.safetensors", struct.pack("<Q", len(hb)) + hb)
    with pytest.raises(st.CheckpointError) as e:
        st.verify_file(path)
    assert "nested too deeply" in e.value.reason


def test_header_that_is_not_an_object_is_refused_before_parsing(tmp_path):
    hb = b"[1, 2, 3]"
    path = write(tmp_path, "list.safetensors", struct.pack("<Q", len(hb)) + hb)
    with pytest.raises(st.CheckpointError, match="start with"):
        st.verify_file(path)


def test_json_error_does_not_echo_the_header(tmp_path):
    secret = "hf_" + "S" * 40
    hb = ('{"a": "%s", oops}' % secret).encode()
    path = write(tmp_path, "bad.safetensors", struct.pack("<Q", len(hb)) + hb)
    with pytest.raises(st.CheckpointError) as e:
        st.verify_file(path)
    assert secret not in str(e.value)


# --- what is in a shard's or the index's place is not a file, or the index is hostile ---------------------------


@pytest.mark.parametrize("what", ["shard", "index"])
def test_fifo_in_place_of_a_shard_or_the_index_is_refused_without_blocking(tmp_path, what):
    import os
    p = tmp_path / ("m.safetensors" if what == "shard" else st.INDEX_NAME)
    os.mkfifo(p)
    fn = (lambda: st.verify_file(str(p), 100)) if what == "shard" else (lambda: st.load_index(str(p)))
    err = _no_hang(fn).get("error")
    assert isinstance(err, st.CheckpointError) and err.path == str(p)
    assert err.reason.startswith("is a FIFO, not a regular file")


def test_index_linked_to_dev_zero_is_refused_before_reading(tmp_path):
    p = tmp_path / st.INDEX_NAME
    p.symlink_to("/dev/zero")
    err = _no_hang(lambda: st.load_index(str(p))).get("error")
    assert isinstance(err, st.CheckpointError) and "a character device" in err.reason


@pytest.mark.parametrize("body,needle", [
    ('{"weight_map": ' + "[" * 20000 + "]" * 20000 + "}", "nests deeper than 64 levels"),
    ('{"metadata": {"total_size": 1e400}, "weight_map": {}}', "not finite"),
    ('{"metadata": {"total_size": 1%s}, "weight_map": {}}' % ("0" * 400), "beyond +/-2**64"),
    ('{"weight_map": {"a": "s.safetensors"}, "x": NaN}', "not a finite JSON number"),
    (b'{"weight_map": {"a": "\xff"}}', "not UTF-8"),
])
def test_hostile_index_is_a_clean_checkpoint_error(tmp_path, body, needle):
    """Before: RecursionError for the nesting bomb; 1e400 and NaN were accepted."""
    p = tmp_path / st.INDEX_NAME
    p.write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(st.CheckpointError) as e:
        st.load_index(str(p))
    assert e.value.path == str(p) and needle in e.value.reason, e.value.reason


def test_index_over_the_size_cap_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "MAX_INDEX_BYTES", 64)
    p = tmp_path / st.INDEX_NAME
    p.write_text(json.dumps({"weight_map": {"t%d" % i: "s.safetensors" for i in range(20)}}))
    with pytest.raises(st.CheckpointError) as e:
        st.load_index(str(p))
    assert "over the 64-byte limit" in e.value.reason


def test_header_nesting_up_to_serde_json_limit_is_read_like_safe_open(tmp_path):
    # an unknown field nested 100 deep: serde_json (limit 128) parses it, safe_open ignores it, so do we
    hb = ('{"__metadata__": {"format": "pt"}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": %s}}'
          % ("[" * 100 + "]" * 100)).encode()
    path = write(tmp_path, "deep.safetensors", struct.pack("<Q", len(hb)) + hb + b"\0")
    assert st.verify_file(path)[0]["tensors"] == ["a"]
    hb = hb.replace(b"[" * 100, b"[" * 130).replace(b"]" * 100, b"]" * 130)
    path = write(tmp_path, "deeper.safetensors", struct.pack("<Q", len(hb)) + hb + b"\0")
    with pytest.raises(st.CheckpointError, match="nested too deeply"):
        st.verify_file(path)


def test_header_number_out_of_range_is_a_clean_error(tmp_path):
    hb = b'{"a": {"dtype": "U8", "shape": [1%s], "data_offsets": [0, 1]}}' % (b"0" * 400)
    path = write(tmp_path, "big.safetensors", struct.pack("<Q", len(hb)) + hb + b"\0")
    with pytest.raises(st.CheckpointError, match="header holds a number"):
        st.verify_file(path)
