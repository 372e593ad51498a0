# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: verified, resumable staging of a model revision to local disk.

Layout next to the published revision ``dest`` (its parent resolved, see ``_stage_layout``):

* ``<dest>.partial/`` - the copy being built. A file appears there under its final name only once it
  is completely written, verified and fsynced (``<name>.llmops-part`` while in flight), and is then recorded
  in ``.llmops-staged.journal`` with the identity of the source file it came from, so a copy killed at any
  point resumes, from the same source or another one, by reusing only what it can prove.
* ``<dest>.lock`` - ``flock`` held for the whole run by whoever writes ``dest`` (``_stage_lock``).
* ``<dest>/.llmops-staged.json`` - the completion marker (``_stage_marker``): per file its size, header digest,
  sha256 where one was computed, the source file's identity and the copy's ``lstat`` at publish.
  ``<dest>.partial`` becomes ``dest`` with one ``rename`` (or an atomic exchange with the previous revision);
  nothing half-copied is ever at ``dest``.

A re-run ``lstat``s the source files and the published copies and compares them with the marker: no data and no
header is read when nothing changed. A copy removed, resized or rewritten after publish, or whose source file is
no longer the one it was copied from, is staged again, alone: the intact files are hard-linked into the new
partial dir and the revision is republished.

Code layout (one idea per file):

* ``_stage`` - the entry points: :func:`stage` (state=present, check mode and diff included), :func:`remove`
  and :func:`prune` (from ``_stage_prune``), and the names callers use;
* ``_stage_layout`` - the paths of a target, the checks that they do not overlap src, the source listing, and
  deleting there (one rename, then ``rmtree``);
* ``_stage_verify`` - reading src's headers and manifest before anything is written; a source file's identity;
* ``_stage_plan`` - what a run does with each file: keep, upgrade, copy again, reuse from ``<dest>.partial``;
* ``_stage_copy`` - the copy engine (read streams, fleet slots, O_DIRECT and its fallbacks, per-file checks,
  per-piece digests);
* ``_stage_fanout`` - receiving pieces from peers instead (``peers``), verified against a seed's digests;
  ``_stage_fanout_wire`` - the protocol it speaks to peers and its checks of every answer; ``_stage_peer`` - the
  board a run keeps of what it holds, and the server that hands it on;
* ``_stage_progress`` - the progress file, and the per-stream read rate;
* ``_stage_publish`` - building ``<dest>.partial`` from reused, copied and linked files and publishing it;
* ``_stage_prune`` - ``state: absent`` and ``keep_revisions``: pinned, in use, lock;
* ``_stage_marker`` - the marker, the journal, checksums manifests and ``StageError``; ``_stage_lock`` - the lock.
"""
from __future__ import annotations

import os
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_copy
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_plan as _plan
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_progress
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_publish as _publish
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_lock import DestLock
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_progress import human_bytes

# The fleet slots, the fan-out (its wire protocol, receiver, board and piece server) and pruning are imported by
# the runs that use them (``_fleet``, ``_fanout``, ``prune``, ``remove``): a plain copy does not import their
# ~2,800 lines and what they pull in (the HTTP client and server, ``ssl``, ``email``). Every import is still a
# plain ``from ... import`` (inside the function), so AnsiballZ finds and packs them.


def _fleet():
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots
    return _fleet_slots


def _fanout():
    """``(_stage_fanout_wire, _stage_fanout, _stage_peer)``."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
    return _stage_fanout_wire, _stage_fanout, _stage_peer


def prune(*args, **kwargs):
    """``_stage_prune.prune``: keep the newest revisions beside dest (``keep_revisions``)."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_prune
    return _stage_prune.prune(*args, **kwargs)


def remove(*args, **kwargs):
    """``_stage_prune.remove``: ``state: absent``."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_prune
    return _stage_prune.remove(*args, **kwargs)


def _check_pinned(pinned):
    if pinned:  # an empty list has nothing to check
        from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_prune
        _stage_prune.check_pinned(pinned)


# Names the module, the tests and the benchmarks use.
MARKER = _marker.MARKER
PART_SUFFIX = _marker.PART_SUFFIX
PARTIAL_SUFFIX = _stage_layout.PARTIAL_SUFFIX
LOCK_SUFFIX = _stage_layout.LOCK_SUFFIX
VERIFY_MODES = _marker.VERIFY_MODES
DIRECT_BUF = _stage_copy.DIRECT_BUF
DIRECT_ALIGN = _stage_copy.DIRECT_ALIGN
PIECE_SIZE = 64 * 1024 * 1024

__all__ = ["DestLock", "StageError", "stage", "remove", "prune"]


def stage(src, dest, verify="headers", checksums=None, read_streams=4, fleet_slots_dir=None,
          fleet_read_streams=None, fleet_host_id=None, fleet_stale_seconds=60.0, min_free_bytes=0,
          progress_file=None, check_mode=False, diff=False, lock_timeout=3600, fsync=True,
          keep_revisions=0, pinned=(), proc_root="/proc", direct_io=True, record_pieces=False,
          piece_size=PIECE_SIZE, peers=None, peer_token=None, peer_rate_limit=0, read_rate_limit=0):
    """Stage ``src`` to ``dest`` (state=present); returns the module result dict.

    ``record_pieces`` records per-piece digests (``piece_size``) so this host can seed peers; ``peers``
    (``[{url, seed}]``, with ``peer_token``) receives the files from them instead of reading src (see
    ``_stage_fanout``). ``read_rate_limit`` caps each read stream on src, in bytes/s.
    """
    t0 = time.monotonic()
    if verify not in VERIFY_MODES:
        raise StageError("verify: must be one of %s, got %r" % (", ".join(VERIFY_MODES), verify))
    if read_streams < 1:
        raise StageError("read_streams: must be at least 1 (got %d)" % read_streams)
    if fleet_slots_dir and not fleet_read_streams:
        raise StageError("fleet_read_streams: required when fleet_slots_dir is set")
    peers = list(peers or [])
    pieces_on = bool(record_pieces or peers)
    try:  # the options that shape the fan-out protocol, before anything is prepared
        if pieces_on or peers or fleet_slots_dir:
            _fanout()[0].check_options(piece_size if pieces_on else None, peers, peer_token, fleet_slots_dir,
                                       fleet_stale_seconds, dest)
        else:  # no fan-out option set: only dest is left to check, by the same rule
            _stage_layout.check_dest(dest)
    except ValueError as e:
        raise StageError(str(e))
    _check_pinned(pinned)
    if peers and not peer_token:
        raise StageError("peer_token: required with peers (the run's token the peers' servers expect)")
    for what, v in (("peer_rate_limit", peer_rate_limit), ("read_rate_limit", read_rate_limit)):
        if v < 0:
            raise StageError("%s: must not be negative (got %d); 0 means no limit" % (what, v))
    src_real, lay = _stage_layout.resolve(src, dest)
    if checksums is None and verify == "sha256" and os.path.isfile(os.path.join(src_real, "SHA256SUMS")):
        checksums = os.path.join(src_real, "SHA256SUMS")
    _stage_layout.check_side_paths(src_real, lay, progress_file, checksums, fleet_slots_dir)
    # names dest's filesystem cannot hold with this module's suffixes, or that are not UTF-8, are refused now:
    # no lock file, no build directory, no fan-out receiver ever sees them
    _stage_layout.check_src_names(src_real, lay)

    result = {"changed": False, "dest": lay.dest, "verify": verify, "files_total": 0, "files_copied": 0,
              "files_skipped": 0, "bytes_total": 0, "bytes_copied": 0, "seconds": 0.0,
              "read_bytes_per_second": 0.0, "peak_read_streams": 0, "fleet_wait_seconds": 0.0,
              "direct_io_files": 0, "copied_files": [], "restaged_files": [], "reason": None,
              "pruned": [], "kept_in_use": [], "unmatched_pins": [], "bytes_from_source": 0, "bytes_from_peers": 0, "peers_used": [],
              "bytes_per_peer": {},
              "bad_pieces_rejected": 0, "peers_dropped": [], "pieces_read_back": 0}
    protect = [src_real] + ([checksums] if checksums else []) + ([progress_file] if progress_file else [])

    def _finish():
        result["seconds"] = round(time.monotonic() - t0, 3)
        if keep_revisions:
            pr = prune(lay, keep_revisions, pinned, check_mode=check_mode, proc_root=proc_root, protect=protect)
            result["pruned"], result["kept_in_use"] = pr["removed"], pr["in_use"]
            result["unmatched_pins"] = pr["unmatched_pins"]
            result["changed"] = result["changed"] or bool(pr["removed"])
        return result

    if check_mode:
        return _stage_check(src_real, lay, verify, checksums, result, diff, _finish)

    with DestLock(lay.lock, lock_timeout):
        lay.check_not_links()
        files, mstate = _scan_src_and_marker(src_real, lay, result)
        plan = _plan.plan(files, src_real, lay, mstate, verify)
        if plan.clean:
            result["files_skipped"] = len(files)
            if record_pieces:
                _pieces_for_published(lay, src_real, mstate.marker, piece_size, read_streams, direct_io, fsync,
                                      result)
            return _finish()
        by_path = dict((f["path"], f) for f in files)

        slots = fleet = None
        if fleet_slots_dir:
            fleet = _fleet()
            slots = fleet.FleetSlots(fleet_slots_dir, fleet_read_streams, host_id=fleet_host_id,
                                     host_max=read_streams, stale_after=fleet_stale_seconds,
                                     acquire_timeout=lock_timeout)
            try:
                slots.open()
            except fleet.FleetSlotError as e:
                raise StageError(str(e), file=e.file, reason=e.reason)
        progress = copier = journal = board = receiver = None
        t_copy = time.monotonic()
        try:
            # The headers, the index and the manifest (a few KiB per file) are read without a fleet slot: the
            # cap is on the bulk streams, and a node waiting behind another node's whole copy to read a header
            # would also keep a fan-out receiver from pulling pieces its peers already hold.
            content = _verify.verify_source(src_real, files, verify, checksums)
            plan = _plan.plan(files, src_real, lay, mstate, verify, content)
            _plan.check_upgrades(plan, lay, files, content, verify)
            n_new = len(plan.copy) - len(plan.restaged)
            result["restaged_files"] = plan.restaged
            result["reason"] = _plan.reason(plan, mstate, verify, n_new)
            if not plan.copy and not plan.extras:
                # every published file is intact and of this source: only the record changes
                records = [_plan.kept_record(plan.keep[f["path"]], f, content) for f in files]
                if record_pieces:
                    _read_back_pieces(lay.real, lay.real, records, piece_size, read_streams, direct_io, result)
                _publish.rewrite_marker(lay, src_real, records, fsync)
                result.update(changed=True, files_skipped=len(files))
                if diff:
                    result["diff"] = _diff(mstate.marker.records, files, lay.dest)
                return _finish()

            reuse = _plan.partial_reusable(lay.partial, files, src_real, verify, content)
            todo = [f for f in plan.copy if f["path"] not in reuse]
            need = sum(f["size"] for f in todo)
            free = _free_bytes(lay.real)
            if free - need < min_free_bytes:
                raise StageError(
                    "no space: %s needs %s for %d files but the dest filesystem has %s free and min_free_bytes "
                    "asks to keep %s; free space on it or lower min_free_bytes"
                    % (lay.dest, human_bytes(need), len(todo), human_bytes(free), human_bytes(min_free_bytes)))
            _publish.prepare_partial(lay.partial, reuse)
            _stage_layout.try_unlink(os.path.join(lay.partial, _marker.JOURNAL))
            journal = _marker.Journal(lay.partial, src_real)
            records = dict(reuse)
            for rec in reuse.values():
                journal.append(rec)

            if pieces_on or read_rate_limit:
                progress = _stage_progress.SourcedProgress(progress_file, lay.dest, need, len(todo),
                                                           read_rate_limit=read_rate_limit)
            else:
                progress = _stage_progress.Progress(progress_file, lay.dest, need, len(todo))
            progress.start()
            if pieces_on:
                _read_back_pieces(lay.partial, lay.partial, list(records.values()), piece_size, read_streams,
                                  direct_io, result)
                board = _fanout()[2].Board(lay.partial, piece_size)
                for rec in records.values():
                    if rec.has_pieces(piece_size):
                        board.add(rec.path, by_path[rec.path], rec.header_sha256, rec.sha256, rec.pieces,
                                  held=True, done=True)
                board.start()
            t_copy = time.monotonic()
            copy_journal = _PieceJournal(journal, board, by_path, piece_size) if pieces_on else journal
            copier = _stage_copy.Copier(src_real, lay.partial, verify, content, read_streams, slots, progress, fsync,
                                        direct_io=direct_io, journal=copy_journal,
                                        piece_size=piece_size if pieces_on else None,
                                        on_piece=board.held if board else None)
            if pieces_on:
                copy_journal.copier = copier
            if peers:
                receiver = _fanout()[1].Receiver(
                    src_real, lay.partial, verify, content, peers, peer_token, piece_size, read_streams, slots,
                    progress, fsync, direct_io=direct_io, journal=journal, board=board,
                    peer_rate_limit=peer_rate_limit, read_rate_limit=read_rate_limit)
                try:
                    receiver.run(todo)
                finally:
                    result.update(bytes_from_peers=receiver.bytes_from_peers, peers_used=receiver.peers_used,
                                  bytes_per_peer=receiver.bytes_per_peer,
                                  bad_pieces_rejected=receiver.bad_pieces_rejected, peers_dropped=receiver.dropped)
                records.update(receiver.records)
                result["bytes_from_source"] += receiver.bytes_from_source
            else:
                _on_board(board, todo, content)
                copier.run(todo)
                result["bytes_from_source"] += sum(f["size"] for f in todo)
            # Intact published files join the build as hard links only now: a copy that failed above has not
            # touched the published revision (a new link changes its inode's ctime).
            unlinked = _publish.link_kept(lay, plan.keep, records, by_path, content, journal)
            if unlinked:
                todo = todo + unlinked
                need += sum(f["size"] for f in unlinked)
                progress.bytes_total, progress.files_total = need, len(todo)
                _on_board(board, unlinked, content)
                copier.run(unlinked)
                result["bytes_from_source"] += sum(f["size"] for f in unlinked)
            records.update(copier.records)
            if record_pieces:
                _read_back_pieces(lay.partial, lay.partial, list(records.values()), piece_size, read_streams,
                                  direct_io, result)
        except BaseException as e:
            if progress:
                progress.finish("failed")
            if board:
                board.close("failed")
            if fleet is not None and isinstance(e, fleet.FleetSlotError):
                # no read slot within lock_timeout, or a broken lease dir
                raise StageError(str(e), file=e.file, reason=e.reason)
            raise
        finally:
            if journal:
                journal.close()
            if slots:
                slots.close()
        copy_seconds = time.monotonic() - t_copy
        progress.state = "publishing"
        ordered = [records[f["path"]] for f in files]
        if board:
            board.close("done")
            board.remove()  # the marker says the same once published; the server reads it from there
        _publish.publish(lay, src_real, ordered, fsync)
        progress.finish("done")

        result.update(
            changed=True, files_copied=len(todo), files_skipped=len(files) - len(todo), bytes_copied=need,
            copied_files=[f["path"] for f in todo],
            read_bytes_per_second=round(need / copy_seconds, 1) if copy_seconds > 0 else 0.0,
            peak_read_streams=copier.peak_streams if copier else 0,
            direct_io_files=(copier.direct_files if copier else 0) + (receiver.direct_files if receiver else 0),
            fleet_wait_seconds=round(slots.wait_seconds, 3) if slots else 0.0)
        if diff:
            result["diff"] = _diff(mstate.marker.records if mstate.marker else [], files, lay.dest)
        return _finish()


def _on_board(board, files, content):
    """Put the files a copy is about to read from src on the board, no piece held yet: the copy marks each piece
    held as soon as it is written (``Copier(on_piece=board.held)``), so peers start pulling a file long before it is
    complete."""
    if board:
        for f in files:
            board.add(f["path"], f, content.header_digests.get(f["path"]), None)


class _PieceJournal(object):
    """The journal the copy engine appends to, giving each completed file its piece digests first and marking it
    done on the board (its pieces were put there one by one as they were written)."""

    def __init__(self, journal, board, by_path, piece_size):
        self.journal = journal
        self.board = board
        self.by_path = by_path
        self.piece_size = piece_size
        self.copier = None

    def append(self, rec):
        pieces = self.copier.piece_digests.get(rec.path) if self.copier else None
        if pieces is not None:
            rec.set_pieces(pieces, self.piece_size)
        self.journal.append(rec)
        if self.board and pieces is not None and rec.path in self.by_path:
            self.board.add(rec.path, self.by_path[rec.path], rec.header_sha256, rec.sha256, pieces, held=True,
                           done=True)


def _read_back_pieces(root, copier_root, records, piece_size, streams, direct_io, result):
    """Give the records without digests at ``piece_size`` their pieces, read back from the copies under ``root``.

    Those copies are this module's own, proven intact and of today's source by the marker or journal (inode, size,
    mtime, ctime, source identity), so they hold the bytes that were read from src; src is not read again.
    """
    missing = [r for r in records if not r.has_pieces(piece_size)]
    if not missing:
        return
    reader = _stage_copy.Copier(copier_root, root, "size", _verify.SourceContent({}, {}, None), streams, None, None,
                                False, direct_io=direct_io, piece_size=piece_size)
    digests = reader.digest_copies([r.path for r in missing])
    for r in missing:
        why = r.damage(root)
        if why:
            raise StageError("dest: %s changed while its piece digests were read back (%s); run again"
                             % (os.path.join(root, r.path), why))
        r.set_pieces(digests[r.path], piece_size)
    result["pieces_read_back"] += len(missing)


def _pieces_for_published(lay, src_real, marker, piece_size, streams, direct_io, fsync, result):
    """A clean revision staged without piece digests (or at another piece size) gets them, so it can seed."""
    missing = [r for r in marker.records if not r.has_pieces(piece_size)]
    if not missing:
        return
    # a few files at a time, the marker rewritten after each batch: the server lists them as they are done
    for start in range(0, len(missing), max(1, streams)):
        _read_back_pieces(lay.real, lay.real, missing[start:start + max(1, streams)], piece_size, streams,
                          direct_io, result)
        _marker.write_marker(lay.real, src_real, _marker.min_level(marker.records), marker.records, fsync,
                             piece_size=piece_size, sequence=marker.sequence)  # not a new publish: same place
    result["changed"] = True
    result["reason"] = "piece digests read back from the staged copy (staged without them), so it can seed peers"


def _scan_src_and_marker(src_real, lay, result):
    """List src, record its totals in ``result`` and read dest's marker; refuse a dest not staged by us."""
    files = _stage_layout.scan_src(src_real, lay)
    result["files_total"] = len(files)
    result["bytes_total"] = sum(f["size"] for f in files)
    mstate = _marker.read_marker(lay.real) if os.path.isdir(lay.real) else _marker.MarkerState("none")
    if os.path.lexists(lay.real) and mstate.kind in ("none", "foreign"):
        why = mstate.reason or "has no %s" % MARKER
        raise StageError("dest: %s exists but %s, so it was not staged by this module; remove it or choose "
                         "another dest" % (lay.dest, why))
    return files, mstate


def _stage_check(src_real, lay, verify, checksums, result, diff, finish):
    """Check mode: the same plan as a real run, reading only."""
    files, mstate = _scan_src_and_marker(src_real, lay, result)
    plan = _plan.plan(files, src_real, lay, mstate, verify)
    if plan.clean:
        result["files_skipped"] = len(files)
        return finish()
    content = _verify.verify_source(src_real, files, verify, checksums)
    plan = _plan.plan(files, src_real, lay, mstate, verify, content)
    _plan.check_upgrades(plan, lay, files, content, verify)
    reuse = {}
    if plan.copy or plan.extras:
        reuse = _plan.partial_reusable(lay.partial, files, src_real, verify, content)
    todo = [f for f in plan.copy if f["path"] not in reuse]
    result.update(changed=True, files_copied=len(todo), files_skipped=len(files) - len(todo),
                  bytes_copied=sum(f["size"] for f in todo), copied_files=[f["path"] for f in todo],
                  restaged_files=plan.restaged,
                  reason=_plan.reason(plan, mstate, verify, len(plan.copy) - len(plan.restaged)))
    if diff:
        result["diff"] = _diff(mstate.marker.records if mstate.marker else [], files, lay.dest)
    return finish()


def _diff(before_records, after_files, dest):
    def fmt(files):
        return "".join("%s %d\n" % (f["path"], f["size"]) for f in files)
    before = [{"path": r.path, "size": r.size} for r in before_records]
    return {"before_header": dest + " (staged files)", "after_header": dest + " (after staging)",
            "before": fmt(before), "after": fmt(after_files)}


def _free_bytes(path):
    st = os.statvfs(_fsutil.nearest_existing(path))
    return st.f_bavail * st.f_frsize
