# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU of the fan-out's peer wire (piece servers and receivers), in one machine, without netns, SSH or Ansible.

The fleet benchmark (``fanout_bench.py``) charges everything a node runs; this isolates what the wire protocol
itself costs: ``--nodes`` receivers (``_stage_fanout.Receiver``, each with its own board) pull a synthetic revision
(``tests/lib/stage_synth.py``) over 127.0.0.1 from one seed and from each other, every node's pieces served by
one ``_stage_peer.PeerServer`` in a process of its own (the seed's and every receiver's revision, as
``/r/<name>/<node>``). Reported per run: the receivers' CPU and the server process's CPU (user + system,
``resource.getrusage``), requests served, and CPU per GiB moved. A micro phase then measures, on one connection
in one process, the CPU of one piece list (whole, and a list of changes), and of one piece per GiB, and the CPU of
one parse of a board of the revision (what a piece server does whenever its node's board changed).

With ``--base TREE`` (a ``git archive`` of another commit, extracted) the two trees are run alternately, round
after round, each in a fresh process importing only its own tree, and medians and spread are printed::

    git archive main | tar -x -C /var/tmp/fw_base
    .venv/bin/python benchmarks/fanout_wire_cpu.py --base /var/tmp/fw_base --runs 3

``--profile DIR`` writes a cProfile of every thread (receivers and server separately) of one run of this tree.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
TOKEN = "fanout-wire-cpu-token-0123456789abcdef"


def pycoll_for(tree):
    """A directory holding ``ansible_collections/llmops/serving`` -> ``tree``, for PYTHONPATH."""
    d = tempfile.mkdtemp(prefix="llmops-fw-pycoll-")
    os.makedirs(os.path.join(d, "ansible_collections", "llmops"))
    os.symlink(os.path.abspath(tree), os.path.join(d, "ansible_collections", "llmops", "serving"))
    return d


def _rusage(who):
    r = resource.getrusage(who)
    return r.ru_utime, r.ru_stime


# ---- profiling every thread ----------------------------------------------------------------------------------
_PROFILES = []


def _profile_threads():
    """Run every thread started from now on under its own ``cProfile.Profile`` (cProfile sees one thread only)."""
    import cProfile
    run = threading.Thread.run

    def profiled(self):
        prof = cProfile.Profile(time.thread_time)  # CPU, not time spent blocked
        _PROFILES.append(prof)
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()
    threading.Thread.run = profiled
    main = cProfile.Profile(time.thread_time)
    _PROFILES.append(main)
    main.enable()
    return main


def _dump_profiles(path):
    import pstats
    for prof in _PROFILES:
        try:
            prof.disable()
        except Exception:  # pylint: disable=broad-except  # a profiler of a thread still running
            pass
        prof.create_stats()
    stats = pstats.Stats(*_PROFILES)
    stats.dump_stats(path)
    with open(path + ".txt", "w") as f:
        stats.stream = f
        stats.sort_stats("tottime").print_stats(45)
        stats.sort_stats("cumulative").print_stats(60)


# ---- one run (child process, importing one tree) ------------------------------------------------------------------
def _source_files(src):
    files = []
    for dirpath, _dirs, names in os.walk(src):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            files.append({"path": os.path.relpath(path, src), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                          "ctime_ns": st.st_ctime_ns, "dev": st.st_dev, "ino": st.st_ino, "mode": st.st_mode & 0o777})
    return sorted(files, key=lambda f: f["path"])


def _serve(work, nodes, piece, pipe_w, stop_r, profile):
    """The server process: one PeerServer for the seed's and every receiver's revision."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
    if profile:
        _profile_threads()
    offers = {"m/seed": _stage_peer.Offer(os.path.join(work, "seed", "m", "r1"), piece)}
    for k in range(nodes):
        offers["m/n%d" % k] = _stage_peer.Offer(os.path.join(work, "n%d" % k, "m", "r1"), piece)
    server = _stage_peer.PeerServer("127.0.0.1", 0, hashlib.sha256(TOKEN.encode()).digest(), offers)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
    t.start()
    os.write(pipe_w, b"%d\n" % server.server_address[1])
    os.read(stop_r, 1)
    served = server.requests
    server.shutdown()
    server.server_close()
    if profile:
        _dump_profiles(os.path.join(profile, "server.prof"))
    u, s = _rusage(resource.RUSAGE_SELF)
    os.write(pipe_w, json.dumps({"requests": served, "user": u, "sys": s}).encode() + b"\n")


def _fork(fn):
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    return pid


def _seed_feeder(stage_peer, src, files, where, piece):
    """The seed as it is while it stages: its files are in place, its board lists their pieces held at ``rate``
    bytes/s (a seed reading the shared filesystem), rewritten as a staging run rewrites it. Returns ``feed(rate)``,
    run in a process of its own."""
    partial = where + ".partial"
    os.makedirs(partial)
    digests = {}
    for f in files:
        with open(os.path.join(src, f["path"]), "rb") as fin:
            data = fin.read()
        os.makedirs(os.path.dirname(os.path.join(partial, f["path"])), exist_ok=True)
        with open(os.path.join(partial, f["path"]), "wb") as fout:
            fout.write(data)
        digests[f["path"]] = [hashlib.sha256(data[i:i + piece]).hexdigest() for i in range(0, len(data), piece)]
    board = stage_peer.Board(partial, piece)
    for f in files:
        board.add(f["path"], f, None, None, [None] * len(digests[f["path"]]), done=True)
    board.write()

    def feed(rate):
        board.start()
        t0 = time.monotonic()
        done = 0
        for f in files:
            for i, d in enumerate(digests[f["path"]]):
                done += min(piece, f["size"] - i * piece)
                time.sleep(max(0.0, t0 + done / float(rate) - time.monotonic()))
                board.held(f["path"], i, d)
        board.close("done")
    return feed


def one_run(args):
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout, _stage_peer, _stage_verify
    from ansible_collections.llmops.serving.tests.lib import fake_peers, stage_synth
    piece = args.piece_kib * 1024
    work = tempfile.mkdtemp(prefix="llmops-fw-", dir=args.tmp)
    try:
        src = os.path.join(work, "shared", "m", "r1")
        stage_synth.write_checkpoint(src, args.size_mib * MIB, shards=8)
        files = _source_files(src)
        total = sum(f["size"] for f in files)
        if args.seed_mib_s:
            feed = _seed_feeder(_stage_peer, src, files, os.path.join(work, "seed", "m", "r1"), piece)
        else:
            fake_peers.board_copy(src, files, os.path.join(work, "seed", "m", "r1"), piece)
        partials = []
        for k in range(args.nodes):
            partials.append(os.path.join(work, "n%d" % k, "m", "r1.partial"))
            os.makedirs(partials[-1])
        port_r, port_w = os.pipe()
        stop_r, stop_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the server process
            code = 1
            try:
                os.close(port_r)
                os.close(stop_w)
                _serve(work, args.nodes, piece, port_w, stop_r, args.profile)
                code = 0
            finally:
                os._exit(code)
        os.close(port_w)
        os.close(stop_r)
        reader = os.fdopen(port_r, "rb")
        port = int(reader.readline())
        base = "http://127.0.0.1:%d/r/m/" % port
        if args.profile:
            _profile_threads()

        class Progress(object):
            def add(self, n=0, files=0, peer=False):
                pass

        receivers, boards = [], []
        for k in range(args.nodes):
            peers = [{"url": base + "seed", "seed": True}] + [{"url": base + "n%d" % j, "seed": False}
                                                              for j in range(args.nodes) if j != k]
            board = _stage_peer.Board(partials[k], piece).start()
            boards.append(board)
            receivers.append(_stage_fanout.Receiver(src, partials[k], "size", _stage_verify.SourceContent({}, {}, None),
                                                    peers, TOKEN, piece, args.streams, None, Progress(), False,
                                                    direct_io=not args.no_direct, board=board, timeout=30.0,
                                                    peer_rate_limit=args.peer_rate))
        u0, s0 = _rusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        feeder = _fork(lambda: feed(args.seed_mib_s * MIB)) if args.seed_mib_s else None
        errors = []

        def go(rx):
            try:
                rx.run(files)
            except Exception as e:  # pylint: disable=broad-except  # reported below
                errors.append(e)
        threads = [threading.Thread(target=go, args=(rx,)) for rx in receivers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        u1, s1 = _rusage(resource.RUSAGE_SELF)
        for b in boards:
            b.close("done")
        if args.profile:
            _dump_profiles(os.path.join(args.profile, "receivers.prof"))
        os.close(stop_w)
        srv = json.loads(reader.readline())
        os.waitpid(pid, 0)
        if feeder:
            os.waitpid(feeder, 0)
        if errors:
            raise SystemExit("a receiver failed: %s" % errors[0])
        for rx in receivers:
            if rx.bytes_from_peers != total or rx.bytes_from_source:
                raise SystemExit("a receiver took %d bytes from peers, %d from the source (of %d)"
                                 % (rx.bytes_from_peers, rx.bytes_from_source, total))
        moved = total * args.nodes
        rx_cpu = (u1 - u0) + (s1 - s0)
        srv_cpu = srv["user"] + srv["sys"]
        out = {"wall": wall, "rx_user": u1 - u0, "rx_sys": s1 - s0, "srv_user": srv["user"], "srv_sys": srv["sys"],
               "cpu": rx_cpu + srv_cpu, "requests": srv["requests"], "gib": moved / float(1 << 30),
               "pieces": args.nodes * sum(-(-f["size"] // piece) for f in files)}
        out["cpu_per_gib"] = out["cpu"] / out["gib"]
        if args.seed_mib_s:  # the seed's list is complete now, as micro() expects
            fake_peers.board_copy(src, files, os.path.join(work, "seed2", "m", "r1"), piece)
            shutil.rmtree(os.path.join(work, "seed"))
            os.rename(os.path.join(work, "seed2"), os.path.join(work, "seed"))
        out["micro"] = micro(work, src, files, piece, args)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def micro(work, src, files, piece, args):
    """CPU (client and server in this process) of one whole piece list, one list of changes (nothing changed,
    no wait) and one piece of ``piece`` bytes, on one persistent connection."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire, _stage_peer
    from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_progress import Throttle
    offers = {"m/seed": _stage_peer.Offer(os.path.join(work, "seed", "m", "r1"), piece)}
    server = _stage_peer.PeerServer("127.0.0.1", 0, hashlib.sha256(TOKEN.encode()).digest(), offers)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
    t.start()
    try:
        client = _stage_fanout_wire.PeerClient(TOKEN, 30.0)
        link = _stage_fanout_wire.PeerLink("http://127.0.0.1:%d/r/m/seed" % server.server_address[1], True)
        body = client.get_body(link, "/pieces?sent=1", 64 * MIB)
        doc = json.loads(body)
        out = {}
        k = args.micro_requests
        c0, w0 = time.process_time(), time.monotonic()
        for _i in range(k):
            client.get_body(link, "/pieces?sent=1", 64 * MIB)
        out["list_full_ms"] = (time.process_time() - c0) * 1000.0 / k
        out["list_full_wall_ms"] = (time.monotonic() - w0) * 1000.0 / k
        q = "/pieces?sent=0&since=%d&epoch=%s&wait=0" % (doc.get("seq", 0), doc.get("epoch", "0"))
        c0 = time.process_time()
        for _i in range(k):
            client.get_body(link, q, 64 * MIB)
        out["list_delta_ms"] = (time.process_time() - c0) * 1000.0 / k
        buf = bytearray(piece)
        f = max(files, key=lambda x: x["size"])
        n_pieces = f["size"] // piece
        rounds = max(1, args.micro_pieces // n_pieces)
        c0 = time.process_time()
        moved = 0
        for _r in range(rounds):
            for i in range(n_pieces):
                client.get_range(link, f["path"], i * piece, piece, buf, Throttle(0))
                moved += piece
        secs = time.process_time() - c0
        out["piece_ms"] = secs * 1000.0 / (rounds * n_pieces)
        out["piece_cpu_per_gib"] = secs / (moved / float(1 << 30))
        client.shutdown()
        out["board_read_ms"] = board_read_ms(files, piece, k)
        return out
    finally:
        server.shutdown()
        server.server_close()


def board_read_ms(files, piece, k):
    """CPU of one parse of a receiver's board of this revision, every piece held (what a piece server does whenever
    its node's board changed: several times a second while the node copies), in ms."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
    board = {"format": _stage_peer.BOARD_FORMAT, "piece_size": piece, "state": "copying", "pid": os.getpid(),
             "updated": time.time(), "files": dict(
                 (f["path"], {"size": f["size"], "src": [1, f["mtime_ns"], f["mtime_ns"]], "done": False,
                              "header_sha256": hashlib.sha256(f["path"].encode()).hexdigest(), "sha256": None,
                              "digests": [hashlib.sha256(b"%d" % i).hexdigest() for i in range(-(-f["size"] // piece))]})
                 for f in files)}
    raw = json.dumps(board, sort_keys=True).encode()
    if _stage_peer._parse_board("board", raw, piece) is None:  # pylint: disable=protected-access
        raise SystemExit("board_read_ms: the board was refused")
    c0 = time.process_time()
    for _i in range(k):
        _stage_peer._parse_board("board", raw, piece)  # pylint: disable=protected-access
    return (time.process_time() - c0) * 1000.0 / k


# ---- A/B driver ---------------------------------------------------------------------------------------------------
def _child(tree, args, profile=None):
    pycoll = pycoll_for(tree)
    try:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--nodes", str(args.nodes), "--size-mib",
               str(args.size_mib), "--piece-kib", str(args.piece_kib), "--streams", str(args.streams), "--tmp",
               args.tmp, "--seed-mib-s", str(args.seed_mib_s), "--peer-rate", str(args.peer_rate),
               "--micro-requests", str(args.micro_requests), "--micro-pieces", str(args.micro_pieces)]
        if args.no_direct:
            cmd.append("--no-direct")
        if profile:
            cmd += ["--profile", profile]
        env = dict(os.environ, PYTHONPATH=pycoll)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, cwd=tree)
        if proc.returncode:
            raise SystemExit("run of %s failed:\n%s" % (tree, proc.stderr[-4000:]))
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(pycoll, ignore_errors=True)


def _fmt(vals, digits=2):
    vals = sorted(vals)
    return "%.*f (%s)" % (digits, statistics.median(vals), " / ".join("%.*f" % (digits, v) for v in vals))


KEYS = [("wall", "wall (s)"), ("cpu", "CPU, all (s)"), ("rx_user", "receivers user (s)"),
        ("rx_sys", "receivers sys (s)"), ("srv_user", "server user (s)"), ("srv_sys", "server sys (s)"),
        ("requests", "requests served"), ("cpu_per_gib", "CPU per GiB moved (s)")]
MICRO = [("list_full_ms", "whole piece list, CPU (ms)"), ("list_full_wall_ms", "whole piece list, wall (ms)"),
         ("list_delta_ms", "list of changes, CPU (ms)"), ("piece_ms", "one piece, CPU (ms)"),
         ("piece_cpu_per_gib", "pieces, CPU per GiB (s)"), ("board_read_ms", "board read, CPU (ms)")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--nodes", type=int, default=4, help="receivers (default 4)")
    ap.add_argument("--size-mib", type=int, default=192, help="revision size (default 192 MiB)")
    ap.add_argument("--piece-kib", type=int, default=4096, help="piece size (default 4096 KiB)")
    ap.add_argument("--streams", type=int, default=1, help="read streams per receiver (pulls: 2 per stream)")
    ap.add_argument("--seed-mib-s", type=float, default=12.0,
                    help="the seed lists its pieces held at this rate, as a seed staging from a shared filesystem "
                         "(default 12 MiB/s, the fleet benchmark's 128 Mbit/s; 0: the seed holds everything at once)")
    ap.add_argument("--peer-rate", type=int, default=8000000,
                    help="each pull at most this many bytes/s (default 8000000: 2 pulls per stream, 128 Mbit/s per "
                         "node; 0: no limit)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--base", default=None, help="another tree (a git archive, extracted) to alternate with")
    ap.add_argument("--tree", default=ROOT, help="the tree measured (default: this checkout)")
    ap.add_argument("--tmp", default="/var/tmp", help="where the revision and the copies go")
    ap.add_argument("--no-direct", action="store_true", help="buffered writes instead of O_DIRECT")
    ap.add_argument("--micro-requests", type=int, default=400)
    ap.add_argument("--micro-pieces", type=int, default=96)
    ap.add_argument("--profile", default=None, help="directory: cProfile one run of --tree, every thread")
    ap.add_argument("--json", default=None, help="write every run's numbers here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args)))
        return 0
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        r = _child(args.tree, args, profile=os.path.abspath(args.profile))
        print(json.dumps(r, indent=1))
        return 0
    trees = [("new", args.tree)] + ([("base", args.base)] if args.base else [])
    results = dict((name, []) for name, _t in trees)
    for k in range(args.runs):
        order = trees if k % 2 == 0 else trees[::-1]
        for name, tree in order:
            r = _child(tree, args)
            results[name].append(r)
            print("run %d %-4s wall %.2f s  CPU %.2f s (rx %.2f+%.2f, server %.2f+%.2f)  %d requests  %.2f CPU-s/GiB"
                  % (k + 1, name, r["wall"], r["cpu"], r["rx_user"], r["rx_sys"], r["srv_user"], r["srv_sys"],
                     r["requests"], r["cpu_per_gib"]), flush=True)
    print("\n%d receivers, %d MiB revision, %d KiB pieces, %d runs each (median (sorted runs))"
          % (args.nodes, args.size_mib, args.piece_kib, args.runs))
    print("| measure | " + " | ".join(name for name, _t in trees) + (" | new / base |" if args.base else " |"))
    print("|---|" + "---|" * (len(trees) + (1 if args.base else 0)))
    rows = [(k, label, lambda r, k=k: r[k]) for k, label in KEYS] + \
        [(k, label, lambda r, k=k: r["micro"][k]) for k, label in MICRO]
    for _k, label, get in rows:
        cells = [_fmt([get(r) for r in results[name]], 3 if "ms" in label else 2) for name, _t in trees]
        if args.base:
            a = statistics.median(get(r) for r in results["new"])
            b = statistics.median(get(r) for r in results["base"])
            cells.append("%.2f" % (a / b) if b else "-")
        print("| %s | %s |" % (label, " | ".join(cells)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
