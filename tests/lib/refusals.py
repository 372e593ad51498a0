# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A test of a refusal asserts that refusal's own reason, never only that something failed: a test that checks
``failed`` alone passes on any earlier, unrelated error (a missing token, a typo in another option) and never
reaches the code it was written for.

:func:`assert_refused` takes a module's result (a dict with ``failed``) or an exception (a library's refusal), and
checks the option it names (the message starts with ``<option>:``, or the result's ``option`` key says it), the
machine-readable ``reason`` where given, and any words of the message.
"""
from __future__ import annotations


def assert_refused(refusal, option=None, reason=None, words=()):
    """``refusal`` (a failed module result, or an exception) names ``option`` and carries ``reason``; returns its
    message. At least one of ``option`` and ``reason`` is required: that is what makes it this refusal."""
    assert option or reason, "say which refusal: give option= or reason="
    if isinstance(refusal, BaseException):
        msg = str(refusal)
        fields = {"reason": getattr(refusal, "reason", None) or getattr(refusal, "limit", None),
                  "option": getattr(refusal, "option", None)}
    else:
        assert refusal.get("failed") is True, "not a failure: %r" % (refusal,)
        msg = refusal.get("msg", "")
        fields = refusal
    if option is not None:
        assert msg.startswith(option + ":") or fields.get("option") == option, (
            "the refusal does not name %s: %r" % (option, refusal if isinstance(refusal, dict) else msg))
        if fields.get("option") is not None:
            assert fields["option"] == option, "option is %r, not %r" % (fields["option"], option)
    if reason is not None:
        assert fields.get("reason") == reason, "reason is %r, not %r: %s" % (fields.get("reason"), reason, msg)
    for w in words:
        assert w in msg, "%r not in the message: %s" % (w, msg)
    return msg
