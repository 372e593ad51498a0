"""_bench_report and _bench_render: the report a reviewer reads (JSON contract, Markdown, PNGs) holds the cells' numbers,
rejects a malformed document naming the field, and says what its data does not prove."""
from __future__ import annotations

import copy
import json
import os
import random
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_render
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_report as br
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_stats as bs

TARGETS = [{"name": "colocated", "url": "http://127.0.0.1:8000", "model": "tiny"},
           {"name": "pd", "url": "http://127.0.0.1:18100", "model": "tiny"}]
META = {"protocol": {"concurrency": [1, 2], "seeds": [1, 2], "lengths": [[128, 32]], "requests_per_round": 16,
                     "warmup_rounds": 1, "interleave": True},
        "client_host": "ctl-1", "client_same_host": True, "started": "2026-12-01T10:00:00Z",
        "ended": "2026-12-01T10:05:00Z"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _round(seed, n, mu, failed=0, evidence=None):
    r = random.Random(seed * 7919 + int(mu * 100))
    samples = []
    for _i in range(n):
        ttft, tpot = r.lognormvariate(mu, 0.3), r.lognormvariate(2.0, 0.1)
        samples.append(dict(ttft_ms=ttft, tpot_ms=tpot, itl_ms=[tpot] * 31, e2el_ms=ttft + 31 * tpot,
                            output_tokens=32, input_tokens=128, seed=seed, ok=True, error=None))
    samples += [dict(ttft_ms=None, tpot_ms=None, itl_ms=[], e2el_ms=None, output_tokens=0, input_tokens=128,
                     seed=seed, ok=False, error="HTTP 503")] * failed
    return dict(seed=seed, rep=0, samples=samples, failed=failed, duration_s=5.0, evidence=evidence)


def _cells(n=16, pd_failed=0, pd_mu=4.5):
    ev = {"kv_bytes": 64 << 20, "rdma_bytes": 70 << 20, "tcp_bytes": 0, "kv_xfer_s": 0.05, "verdict": "pass"}
    cells = []
    for c in (1, 2):
        cells.append(bs.cell("colocated", c, 128, 32, [_round(s, n, 3.0) for s in (1, 2)], n_boot=100))
        pd_rounds = [_round(s, n, pd_mu, failed=pd_failed, evidence=dict(ev)) for s in (1, 2)]
        cells.append(bs.cell("pd", c, 128, 32, pd_rounds, n_boot=100))
    return cells


_BASE = {}


def _report(**kw):
    """A report of the default cells (computed once) with a fresh copy of everything."""
    if "cells" in kw:
        cells = kw.pop("cells")
    else:
        if "cells" not in _BASE:
            _BASE["cells"] = _cells()
        cells = copy.deepcopy(_BASE["cells"])
    comps = [bs.compare(a, b, m, n_boot=200) for a in cells if a["target"] == "colocated"
             for b in cells if b["target"] == "pd" and b["concurrency"] == a["concurrency"] for m in bs.METRICS]
    args = dict(comparisons=comps)
    args.update(kw)
    return br.build(TARGETS, cells, META, **args)


def test_build_follows_the_contract_and_round_trips_through_json():
    rep = _report()
    assert rep["schema"] == br.SCHEMA == 1
    assert [t["name"] for t in rep["targets"]] == ["colocated", "pd"]
    assert len(rep["cells"]) == 4
    c = rep["cells"][0]
    for k in ("target", "concurrency", "input_len", "output_len", "requests", "failed", "samples", "unstable"):
        assert k in c
    for m in ("ttft", "tpot", "e2el"):
        assert isinstance(c["p95_%s_ms_pooled" % m], float)
        assert isinstance(c["p95_%s_ms_mean_of_seeds" % m], float)
        lo, hi = c["p95_%s_ms_ci95" % m]
        assert lo <= hi
    assert rep["comparisons"] and all(cp["verdict"] == "differs" for cp in rep["comparisons"] if cp["metric"] == "ttft")
    again = json.loads(json.dumps(rep, allow_nan=False))
    assert br.validate(again) is again


@pytest.mark.parametrize("mutate, path", [
    (lambda r: r.update(schema=2), "schema"),
    (lambda r: r.pop("targets"), "targets"),
    (lambda r: r["targets"].append({"name": "colocated"}), r"targets\[2\]\.name"),
    (lambda r: r["cells"][1].update(target="nowhere"), r"cells\[1\]\.target"),
    (lambda r: r["cells"][2].update(p95_ttft_ms_ci95=[5.0]), r"cells\[2\]\.p95_ttft_ms_ci95"),
    (lambda r: r["cells"][2].update(p95_tpot_ms_ci95=[9.0, 1.0]), r"cells\[2\]\.p95_tpot_ms_ci95: low"),
    (lambda r: r["cells"][0].pop("p95_e2el_ms_pooled"), r"cells\[0\]\.p95_e2el_ms_pooled"),
    (lambda r: r["cells"][0].update(unstable="no"), r"cells\[0\]\.unstable"),
    (lambda r: r["cells"][0].update(failed=10 ** 6), r"cells\[0\]\.failed"),
    (lambda r: r["cells"][3]["samples"][4].update(ttft_ms="fast"), r"cells\[3\]\.samples\[4\]\.ttft_ms"),
    (lambda r: r["cells"][3]["samples"][0].pop("seed"), r"cells\[3\]\.samples\[0\]\.seed"),
    (lambda r: r["cells"].append(copy.deepcopy(r["cells"][0])), r"cells\[4\]: a second cell"),
    (lambda r: r["comparisons"][0].update(verdict="better"), r"comparisons\[0\]\.verdict"),
    (lambda r: r.update(stopped={"reason": "died", "after_round": 9, "of_rounds": 4}), r"stopped\.after_round"),
    (lambda r: r.update(coldstart={"states": [{"state": "nvme", "reps": [{"phases": {"load": -1.0}}]}]}),
     r"coldstart\.states\[0\]\.reps\[0\]\.phases\.load"),
    (lambda r: r["meta"].update(x=float("nan")), r"meta\.x"),
])
def test_validate_rejects_a_malformed_report_naming_the_field(mutate, path):
    rep = _report()
    mutate(rep)
    with pytest.raises(ValueError, match="^" + path):
        br.validate(rep)


def test_caveats_come_from_the_data():
    def codes(rep):
        return {c["code"] for c in rep["caveats"]}

    one_rep = {"states": [{"state": "nvme", "reps": [{"phases": {"load": 3.0}, "total_s": 3.0, "marks": {}}]}]}
    rep = _report(stopped={"reason": "pd: connection refused", "after_round": 5, "of_rounds": 8},
                  coldstart=one_rep, cells=_cells(n=16, pd_failed=2))
    got = codes(rep)
    for code in ("stopped_early", "few_requests", "narrow_interval", "failed_requests", "client_same_host",
                 "concurrency_not_users", "single_length", "coldstart_reps", "kv_metric_scope"):
        assert code in got, (code, got)
    text = " ".join(c["text"] for c in rep["caveats"])
    assert "after round 5 of 8" in text and "ctl-1" in text and "8 request(s) failed in 2 cell(s)" in text
    # plenty of requests, no failures, another host, identical targets: those caveats are gone, and the A/B
    # says it cannot tell
    quiet_meta = dict(META, client_same_host=False)
    cells = [bs.cell(t, 1, 128, 32, [_round(s, 120, 3.0) for s in (1, 2)], n_boot=50) for t in ("colocated", "pd")]
    rep2 = br.build(TARGETS, cells, quiet_meta, comparisons=[bs.compare(cells[0], cells[1], "ttft", n_boot=200)])
    got2 = codes(rep2)
    assert not got2 & {"stopped_early", "few_requests", "narrow_interval", "failed_requests", "client_same_host",
                       "unstable", "coldstart_reps"}
    assert "cannot_tell" in got2
    # seeds far apart: the cell is unstable and the caveat names it
    far = bs.cell("pd", 2, 128, 32, [_round(1, 40, 3.0), _round(2, 40, 4.0)], n_boot=50)
    rep3 = br.build(TARGETS, [far], META)
    assert "unstable" in codes(rep3) and "pd C=2 128/32" in " ".join(c["text"] for c in rep3["caveats"])


def test_markdown_has_the_tables_the_evidence_and_the_caveats():
    rep = _report(stopped={"reason": "pd: connection refused", "after_round": 5, "of_rounds": 8})
    rep["meta"]["notes"] = ["repetitions of one seed send the same prompts"]
    md = _bench_render.markdown(rep)
    assert "| client same host | True |" in md and "| warmup rounds | 1 |" in md
    assert "- repetitions of one seed send the same prompts" in md
    assert "## colocated" in md and "## pd" in md
    c = next(x for x in rep["cells"] if x["target"] == "pd" and x["concurrency"] == 2)
    figures = (c["p50_ttft_ms_pooled"], c["p95_ttft_ms_pooled"], c["p95_ttft_ms_mean_of_seeds"]) + tuple(c["p95_ttft_ms_ci95"])
    assert "%.1f / %.1f (%.1f) [%.1f, %.1f]" % figures in md
    # transport evidence: KV bytes moved (2 rounds x 64 MiB), RDMA / KV ratio, NIXL rate, and the rate A/B
    assert "## Transport evidence" in md and "128.0 MiB" in md and "1.09×" in md
    assert "**differs**" in md and "## A/B" in md
    assert "stopped after round 5 of 8" in md
    tail = md.split("## What this does not prove", 1)[1]
    for cav in rep["caveats"]:
        assert cav["text"] in tail


def test_write_produces_the_report_files_and_the_plots(tmp_path):
    rep = _report(coldstart={"states": [
        {"state": state, "reps": [{"phases": {"process": 1.0, "weights": w, "compile": 2.0, "first_answer": 0.5},
                                   "total_s": 3.5 + w, "marks": {}} for w in (4.0, 5.0)]}
        for state in ("shared_fs", "nvme", "nvme_compile_cache")]})
    out = tmp_path / "out" / "run1"  # created
    written = _bench_render.write(rep, str(out))
    names = ["ab_delta.png", "coldstart.png", "latency_p95.png", "throughput.png"]
    assert [os.path.basename(p) for p in written[:2]] == ["report.json", "report.md"]
    assert sorted(os.path.basename(p) for p in written[2:]) == names
    assert sorted(os.listdir(str(out))) == sorted(["report.json", "report.md"] + names)  # no temporary files
    for p in written[2:]:
        with open(p, "rb") as f:
            data = f.read()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    with open(str(out / "report.json")) as f:
        doc = json.load(f)
    assert doc["cells"][0]["samples"][0]["seed"] == 1 and doc["caveats"] == rep["caveats"]
    assert (out / "report.md").read_text() == _bench_render.markdown(rep)


def test_plots_without_comparisons_or_cold_start(tmp_path):
    bare = br.build(TARGETS[:1], [_cells()[0]], META)
    paths = _bench_render.plots(bare, str(tmp_path / "plots"))
    assert sorted(os.path.basename(p) for p in paths) == ["latency_p95.png", "throughput.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == PNG_MAGIC


def test_write_refuses_an_invalid_report_and_leaves_the_old_files(tmp_path):
    rep = br.build(TARGETS[:1], [_cells()[0]], META)
    _bench_render.write(rep, str(tmp_path))
    before = (tmp_path / "report.json").read_bytes()
    bad = copy.deepcopy(rep)
    bad["cells"][0]["p95_ttft_ms_ci95"] = "wide"
    with pytest.raises(ValueError, match=r"cells\[0\]\.p95_ttft_ms_ci95"):
        _bench_render.write(bad, str(tmp_path))
    assert (tmp_path / "report.json").read_bytes() == before


def test_transport_evidence_gives_the_nixl_rate_ratio_and_flags_a_failed_transport_check():
    # the same KV volume moved in 1.1 s over TCP and 0.05 s over RDMA: RDMA moved 22x the NIXL rate
    tcp_ev = {"kv_bytes": 1 << 30, "rdma_bytes": 0, "tcp_bytes": 1 << 30, "kv_xfer_s": 1.1,
              "verdict": {"status": "pass", "summary": "expect tcp: PASS"}}
    rdma_ev = {"kv_bytes": 1 << 30, "rdma_bytes": 1 << 30, "tcp_bytes": 0, "kv_xfer_s": 0.05, "verdict": "fail"}
    targets = [{"name": "tcp|ucx", "url": "http://127.0.0.1:18100"}, {"name": "rdma", "url": "http://127.0.0.1:18101"}]
    cells = [bs.cell(t, 8, 4096, 256, [_round(s, 12, 3.0, evidence=dict(ev)) for s in (1, 2)], n_boot=50)
             for t, ev in (("tcp|ucx", tcp_ev), ("rdma", rdma_ev))]
    rep = br.build(targets, cells, META)
    md = _bench_render.markdown(rep)
    assert "| 8 | 4096/256 | 930.9 MiB/s | 20.0 GiB/s | 22.0× |" in md  # 2 GiB in 2.2 s vs in 0.1 s
    assert "| tcp\\|ucx | 8 | 4096/256 | 2.0 GiB | 0 B | 2.0 GiB | 0.00× |" in md  # a | in a name stays in its cell
    assert "## Rounds" in md and md.count("| rdma | 8 | 4096/256 | ") == 2 + 1  # two rounds + the evidence row
    cav = [c for c in rep["caveats"] if c["code"] == "transport_verdict"]
    assert cav and "rdma C=8 4096/256" in cav[0]["text"] and "tcp|ucx C=8" not in cav[0]["text"]
    assert "- rdma C=8 4096/256, seed 1 rep 0: fail" in md
    # rounds without readable counters are called out
    assert "transport_incomplete" not in {c["code"] for c in rep["caveats"]}
    rep["cells"][1]["evidence"][0]["rdma_bytes"] = None
    assert "transport_incomplete" in {c["code"] for c in br.caveats(rep)}


def test_a_cold_start_report_without_load_cells(tmp_path):
    cs = {"states": [{"state": "shared_fs", "reps": [{"phases": {"port": 2.0, "weights": 30.0, "compile": 9.0},
                                                      "total_s": 41.0, "marks": {}},
                                                     {"phases": {"port": 2.0, "weights": 26.0, "compile": 9.0},
                                                      "total_s": 37.0, "marks": {}}]},
                     {"state": "nvme", "reps": [{"phases": {"port": 2.0, "weights": 6.0, "compile": 9.0},
                                                 "total_s": 17.0, "marks": {}}] * 3}]}
    rep = br.build([{"name": "engine", "url": "http://127.0.0.1:8000", "model": "tiny"}], [],
                   {"client_same_host": False}, coldstart=cs)
    codes = [c["code"] for c in rep["caveats"]]
    assert codes == ["coldstart_reps"] and "shared_fs (2)" in rep["caveats"][0]["text"]
    md = _bench_render.markdown(rep)
    assert "| shared_fs | 2 | 2.0 | 26.0 | 9.0 | 37.0 |" in md
    assert "| shared_fs | 2 | 39.0 (37.0..41.0) |" in md and "| nvme | 3 | 17.0 (17.0..17.0) |" in md
    paths = _bench_render.write(rep, str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == ["coldstart.png", "report.json", "report.md"]


def test_without_matplotlib_the_report_has_no_plots_and_says_why(tmp_path, monkeypatch):
    """``sys.modules[name] = None`` makes ``import name`` raise ImportError, as on a host without the library."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert _bench_render.pyplot() is None
    rep = _report()
    written = _bench_render.write(rep, str(tmp_path))
    assert sorted(os.path.basename(p) for p in written) == ["report.json", "report.md"]
    assert sorted(os.listdir(str(tmp_path))) == ["report.json", "report.md"]
    with open(str(tmp_path / "report.json")) as f:
        doc = json.load(f)
    assert [c["code"] for c in doc["caveats"]].count("no_plots") == 1
    assert "matplotlib" in (tmp_path / "report.md").read_text().split("## What this does not prove", 1)[1]
    assert _bench_render.plots(rep, str(tmp_path / "plots")) == []
    _bench_render.write(rep, str(tmp_path))  # a second write does not repeat the caveat
    assert [c["code"] for c in rep["caveats"]].count("no_plots") == 1
