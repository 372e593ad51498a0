# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the one reader for files and bodies the collection does not control.

Every JSON / YAML / text document read from disk (markers, manifests, ``config.json``, ``state.json``, round
files, baselines), from a peer (``/pieces``), from a cluster (``kubectl get -o json``) or from a log line goes
through this module. The rules, each with an error that names the file (or field) and the limit:

* **file type**: the path is opened with ``O_NONBLOCK`` (a FIFO never blocks the open) and ``fstat``-ed; only
  a regular file is read: FIFOs, character/block devices (``/dev/zero``), sockets and directories are refused;
* **size**: at most ``max_bytes`` are read (``/dev/zero`` behind a symlink, or a file growing while read,
  cannot fill memory);
* **nesting**: containers nest at most ``max_depth`` levels (checked without recursion, so a nesting bomb is a
  clean error, never ``RecursionError``, and code that walks the result recursively is safe);
* **numbers**: every number is finite and within ``+/- MAX_ABS_NUMBER`` (``NaN``, ``Infinity``, ``1e999``,
  ``10**400`` are refused); text is UTF-8.

Refusal raises :class:`UntrustedInput` (a ``ValueError``) carrying ``file`` and ``limit``; the message never
quotes the document.
"""
from __future__ import annotations

import errno
import itertools
import json
import math
import os
import re
import stat

#: Default cap for a document read whole (markers, manifests, state files, round files).
MAX_BYTES = 16 * 1024 * 1024
#: Default nesting cap: the deepest document the collection writes nests fewer than 10 levels.
MAX_DEPTH = 64
#: Largest magnitude a number may have: byte counts, nanoseconds since the epoch, safetensors offsets and
#: unsigned 64-bit hardware counters (an RDMA counter saturates at ``2**64 - 1``) all fit.
MAX_ABS_NUMBER = 2 ** 64
#: Longest integer literal accepted (digits); a longer one is refused before conversion.
_MAX_INT_DIGITS = 20
#: Longest YAML scalar that may be read as a number; a longer one is refused before conversion (Python refuses
#: integers of over 4300 digits with a bare ValueError, and sexagesimal ``1:2:3:...`` costs quadratic time).
_MAX_YAML_NUMBER_CHARS = 128
_YAML_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class UntrustedInput(ValueError):
    """A document that breaks one of the rules; ``file`` names it, ``limit`` the rule (``type``, ``size``,
    ``depth``, ``number``, ``encoding``, ``syntax``, ``read``)."""

    def __init__(self, msg, file=None, limit=None):
        super(UntrustedInput, self).__init__(msg)
        self.file = file
        self.limit = limit


def _kind(mode):
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _require_regular(st, label, path):
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedInput("%s is %s, not a regular file, so it is not read; replace it with the file the "
                             "collection wrote (or remove it)" % (label, _kind(st.st_mode)),
                             file=path, limit="type")


def _open_regular_fd(path, label, follow):
    """``(fd, stat)`` of the regular file ``path``, opened without blocking; the caller closes ``fd``."""
    # The type is checked before the open too: opening a device can have effects of its own (a tape rewinds,
    # a watchdog arms), and a socket cannot be opened at all. fstat after the open closes the race.
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UntrustedInput("%s cannot be opened (%s)" % (label, e.strerror or e.__class__.__name__),
                             file=path, limit="read")
    if not follow and stat.S_ISLNK(st.st_mode):
        raise UntrustedInput("%s is a symlink; it is not followed: replace it with the real file" % label,
                             file=path, limit="type")
    _require_regular(st, label, path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if not follow and e.errno == errno.ELOOP:  # the last component became a symlink
            raise UntrustedInput("%s is a symlink; it is not followed: replace it with the real file" % label,
                                 file=path, limit="type")
        raise UntrustedInput("%s cannot be opened (%s)" % (label, e.strerror or e.__class__.__name__),
                             file=path, limit="read")
    try:
        st = os.fstat(fd)
        _require_regular(st, label, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular(path, field=None, follow=True):
    """A binary file object on the regular file ``path`` (for readers that take only part of a large file,
    such as a safetensors header), opened and type-checked like :func:`read_bytes`: a FIFO, a device, a
    socket or a directory raises :class:`UntrustedInput` without blocking; a missing file raises
    ``FileNotFoundError``."""
    label = "%s: %s" % (field, path) if field else str(path)
    fd, _st = _open_regular_fd(path, label, follow)
    return os.fdopen(fd, "rb")


def read_bytes(path, field=None, max_bytes=MAX_BYTES, follow=True):
    """The bytes of the regular file ``path``, at most ``max_bytes``.

    ``field`` is how errors name the file (an option name, ``"marker"``); ``follow=False`` also refuses a
    symlink as the last component. Raises :class:`UntrustedInput`; a missing file raises the
    ``FileNotFoundError`` untouched so that callers can treat "absent" apart from "hostile".
    """
    label = "%s: %s" % (field, path) if field else str(path)
    fd, st = _open_regular_fd(path, label, follow)
    try:
        if st.st_size > max_bytes:
            raise UntrustedInput("%s is %d bytes, over the %d-byte limit for this file; it is not read"
                                 % (label, st.st_size, max_bytes), file=path, limit="size")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            size += len(chunk)
            chunks.append(chunk)
            if size > max_bytes:
                raise UntrustedInput("%s grew past the %d-byte limit while being read" % (label, max_bytes),
                                     file=path, limit="size")
    except OSError as e:
        raise UntrustedInput("%s cannot be read (%s)" % (label, e.strerror or e.__class__.__name__),
                             file=path, limit="read")
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path, field=None, max_bytes=MAX_BYTES, follow=True, errors="strict"):
    """:func:`read_bytes` decoded as UTF-8 (``errors="replace"`` for logs)."""
    data = read_bytes(path, field, max_bytes, follow)
    return decode(data, field or path, file=path, errors=errors)


def decode(data, field, file=None, errors="strict"):
    """UTF-8 text of ``data`` or :class:`UntrustedInput` naming ``field``."""
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8", errors=errors)
    except UnicodeDecodeError:
        raise UntrustedInput("%s is not UTF-8 text" % field, file=file, limit="encoding")


def check_value(doc, field, max_depth=MAX_DEPTH, file=None):
    """Walk ``doc`` without recursion: containers nest at most ``max_depth`` levels, numbers are finite and
    within ``MAX_ABS_NUMBER``, mapping keys are strings. Returns ``doc``."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        if isinstance(value, (int, float)):
            _check_number(value, field, file)
            continue
        if isinstance(value, (dict, list, tuple, set, frozenset)):
            if depth > max_depth:
                raise UntrustedInput("%s nests deeper than %d levels, so it is refused" % (field, max_depth),
                                     file=file, limit="depth")
            if isinstance(value, dict):
                for k, v in value.items():
                    if not isinstance(k, str):
                        _check_key(k, field, file)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in value)
    return doc


def _check_key(k, field, file):
    # YAML mappings may have int/float/bool keys; JSON keys are always strings. Numbers still obey the range.
    if isinstance(k, (int, float)) and not isinstance(k, bool):
        _check_number(k, field, file)


def _number_problem(value):
    """What is wrong with the number ``value`` (``holds ...``), or None: the one rule for values walked and parsed."""
    if isinstance(value, float) and not math.isfinite(value):  # 1e400 parses as infinity
        return "holds a number that is not finite (NaN or infinity)"
    if abs(value) > MAX_ABS_NUMBER:
        return "holds a number beyond +/-2**64"
    return None


def _check_number(value, field, file):
    problem = _number_problem(value)
    if problem:
        raise UntrustedInput("%s %s, so it is refused" % (field, problem), file=file, limit="number")


class _NumberOutOfRange(ValueError):
    pass


def _refuse_constant(name):
    raise _NumberOutOfRange("holds %s, not a finite JSON number" % name)


def _checked(value):
    problem = _number_problem(value)
    if problem:
        raise _NumberOutOfRange(problem)
    return value


def _parse_int(text):
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _NumberOutOfRange("holds a number beyond +/-2**64 (an integer of %d digits)" % len(text.lstrip("-")))
    return _checked(int(text))


def _parse_float(text):
    return _checked(float(text))


def _check_body_size(data, field, file, max_bytes):
    """A body's size in bytes (a ``str`` counts as its UTF-8 encoding: up to 4 bytes a character)."""
    size = len(data)
    if isinstance(data, str) and size * 4 > max_bytes:
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise UntrustedInput("%s is %d bytes, over the %d-byte limit; it is not parsed" % (field, size, max_bytes),
                             file=file, limit="size")


def loads_json(data, field, max_depth=MAX_DEPTH, file=None, max_bytes=MAX_BYTES, object_pairs_hook=None):
    """Parse a JSON body (``bytes`` or ``str``) under the rules above. ``object_pairs_hook`` is json's (a
    ``ValueError`` it raises, such as a duplicate key, is a ``syntax`` refusal with its message).

    Every rule holds before the document exists, so it is not walked again (:func:`check_value` walks what did not
    come through here): the nesting is counted in the text (:func:`_bracket_depth`), every number is checked as it
    is parsed (``parse_int``, ``parse_float``, ``parse_constant``) and JSON keys are strings. A piece server parses
    its node's board several times a second and a receiver a piece list from every peer: one pass fewer over each."""
    _check_body_size(data, field, file, max_bytes)
    text = decode(data, field, file=file)
    depth = _bracket_depth(text)
    if depth > max_depth:
        raise UntrustedInput("%s nests deeper than %d levels, so it is refused" % (field, max_depth),
                             file=file, limit="depth")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float,
                         object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise UntrustedInput("%s is not JSON (%s at line %d column %d)" % (field, e.msg, e.lineno, e.colno),
                             file=file, limit="syntax")
    except _NumberOutOfRange as e:
        raise UntrustedInput("%s %s, so it is refused" % (field, e), file=file, limit="number")
    except ValueError as e:  # Python's own integer-size limit, or object_pairs_hook's refusal
        raise UntrustedInput("%s is refused: %s" % (field, str(e)[:160]), file=file, limit="syntax")
    except RecursionError:
        raise UntrustedInput("%s nests too deeply to parse, so it is refused" % field, file=file, limit="depth")
    return doc


# A complete JSON string (escapes included), and everything that is neither a bracket nor a quote.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r'[^\[\]{}"]+')
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _bracket_depth(text):
    """Deepest ``[``/``{`` nesting of a JSON text, strings skipped; linear, no recursion, no parse (the scanning
    runs in the regular expression engine: a 16 MiB document takes a fraction of a second)."""
    if "[" not in text and "{" not in text:
        return 0
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    quote = brackets.find('"')
    if quote >= 0:  # an unterminated string runs to the end: the parser will say so
        brackets = brackets[:quote]
    if not brackets:
        return 0
    deepest = max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, brackets)))
    return deepest if deepest > 0 else 0


def load_json(path, field=None, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, follow=True):
    """Read and parse the JSON file ``path`` under every rule."""
    data = read_bytes(path, field, max_bytes, follow)
    return loads_json(data, "%s: %s" % (field, path) if field else str(path), max_depth, file=path,
                      max_bytes=max_bytes)


def loads_yaml(data, field, max_depth=MAX_DEPTH, file=None, max_bytes=MAX_BYTES, all_documents=False):
    """Parse one YAML document (safe loader) under the rules: depth is counted on the event stream before
    anything is built, aliases are refused (no expansion bombs), numbers are checked after.
    ``all_documents=True`` reads a ``---``-separated stream and returns the list of its documents."""
    # imported here: only YAML readers need it
    import yaml  # pylint: disable=import-outside-toplevel

    _check_body_size(data, field, file, max_bytes)
    text = decode(data, field, file=file)
    resolver = yaml.resolver.Resolver()
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > max_depth:
                    raise UntrustedInput("%s nests deeper than %d levels, so it is refused" % (field, max_depth),
                                         file=file, limit="depth")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                raise UntrustedInput("%s uses a YAML alias (*name); write the value out in full" % field,
                                     file=file, limit="syntax")
            elif isinstance(event, yaml.ScalarEvent) and len(event.value) > _MAX_YAML_NUMBER_CHARS:
                tag = event.tag
                if tag is None or tag == "!":
                    tag = resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
                if tag in _YAML_NUMBER_TAGS:
                    raise UntrustedInput("%s holds a number written in over %d characters, so it is refused"
                                         % (field, _MAX_YAML_NUMBER_CHARS), file=file, limit="number")
        doc = list(yaml.safe_load_all(text)) if all_documents else yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = " at line %d column %d" % (mark.line + 1, mark.column + 1) if mark is not None else ""
        raise UntrustedInput("%s is not YAML%s" % (field, where), file=file, limit="syntax")
    except (ValueError, OverflowError) as e:
        if isinstance(e, UntrustedInput):
            raise
        # a scalar the safe constructor cannot build: a date like 2024-13-45, a number out of range
        raise UntrustedInput("%s holds a value that cannot be read (%s)" % (field, e.__class__.__name__),
                             file=file, limit="syntax")
    except RecursionError:
        raise UntrustedInput("%s nests too deeply to parse, so it is refused" % field, file=file, limit="depth")
    return check_value(doc, field, max_depth, file)


def load_yaml(path, field=None, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, follow=True):
    """Read and parse the YAML file ``path`` under every rule."""
    data = read_bytes(path, field, max_bytes, follow)
    return loads_yaml(data, "%s: %s" % (field, path) if field else str(path), max_depth, file=path,
                      max_bytes=max_bytes)


# ---- quoting and figures from text the collection does not control -------------------------------------- #

#: How much of a rejected value a message quotes (:func:`excerpt`).
EXCERPT_CHARS = 120
#: Longest text that may be read as one figure (:func:`figure`): a duration, a byte count or a Prometheus sample
#: value never needs more; a longer one is refused before conversion.
MAX_FIGURE_CHARS = 64


def excerpt(value, limit=EXCERPT_CHARS):
    """A short quote of ``value`` (text the collection does not control: a log or metrics line, an answer's
    body) for a message: its ``repr`` when it has at most ``limit`` characters, else the ``repr`` of its first
    ``limit`` characters and how long it was. Bytes are decoded (undecodable bytes replaced). Every message that
    quotes rejected input quotes it through this, never whole: a 5 MB line stays a short message."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        size = len(value)
        text = bytes(value[:limit * 4]).decode("utf-8", "replace")  # a character is at most 4 bytes
        whole = size <= limit * 4 and len(text) <= limit
        unit = "bytes"
    else:
        text = value if isinstance(value, str) else str(value)
        size = len(text)
        whole = size <= limit
        unit = "characters"
    if whole:
        return repr(text)
    return "%r... (the first %d of %d %s)" % (text[:limit], limit, size, unit)


def figure(value, field, nonnegative=False, maximum=MAX_ABS_NUMBER):
    """The number ``value`` holds (a figure read from a log line or a metrics answer: text, or a number already
    parsed) as a float, or :class:`UntrustedInput` (``limit="number"``) naming ``field``.

    A figure is a decimal number written in at most :data:`MAX_FIGURE_CHARS` characters, finite (``NaN``,
    ``+Inf``, ``1e999`` and 400 nines are refused), within ``+/- maximum``, and not negative with
    ``nonnegative`` (a count, or a sum of durations or bytes, cannot be). JSON written from it never holds
    ``Infinity`` or ``NaN``."""
    if isinstance(value, bool):
        number = None
    elif isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int beyond a double
            raise UntrustedInput("%s holds a number beyond +/-%g, so it is refused" % (field, maximum), limit="number")
    elif isinstance(value, (str, bytes)):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        text = text.strip()
        if len(text) > MAX_FIGURE_CHARS:
            raise UntrustedInput("%s is a number written in over %d characters (%s), so it is refused"
                                 % (field, MAX_FIGURE_CHARS, excerpt(text)), limit="number")
        try:
            number = float(text)
        except ValueError:
            raise UntrustedInput("%s is not a number: %s" % (field, excerpt(text)), limit="number")
    else:
        number = None
    if number is None:
        raise UntrustedInput("%s is %s, not a number" % (field, type(value).__name__), limit="number")
    if not math.isfinite(number):
        raise UntrustedInput("%s is %s, not a finite number, so it is refused" % (field, number), limit="number")
    if abs(number) > maximum:
        raise UntrustedInput("%s is %g, beyond +/-%g, so it is refused" % (field, number, maximum), limit="number")
    if nonnegative and number < 0:
        raise UntrustedInput("%s is %g: it is a count or a sum, which cannot be negative" % (field, number),
                             limit="number")
    return number


def figure_or_none(value, field="a figure", nonnegative=False, maximum=MAX_ABS_NUMBER):
    """:func:`figure`, or None where it refuses ``value`` (a figure of a log line that cannot be is unknown,
    never a traceback and never ``Infinity`` in a file written after)."""
    try:
        return figure(value, field, nonnegative=nonnegative, maximum=maximum)
    except UntrustedInput:
        return None
