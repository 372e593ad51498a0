# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test helper: the arguments a role's task passes to a module, templated from the role's own files.

A test that runs a module "as the role calls it" reads the task from ``roles/<role>/tasks/*.yml`` and templates its
arguments with the role's ``defaults/`` and ``vars/`` (and the test's overrides, as inventory or registered results
would set them), the way Ansible does: Jinja2 expressions evaluated to native values (``jinja2.nativetypes``, as
ansible-core's templar), ``omit`` drops the argument, variables resolved lazily (a default may refer to another).
Only what the collection's tasks use is provided: the ``bool``, ``combine`` and ``to_json`` filters, the
``ansible.builtin.file`` and ``ansible.builtin.env`` lookups. An undefined variable raises, so a task that refers to
something the test did not provide fails loudly instead of passing with a blank.
"""
from __future__ import annotations

import functools
import glob
import json
import os

import yaml
from jinja2 import StrictUndefined, Undefined, meta
from jinja2.nativetypes import NativeEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OMIT = "__omit_place_holder__role_tasks"


def _bool(value):
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def _combine(*dicts, **kw):
    out = {}
    for d in dicts:
        for k, v in (d or {}).items():
            if kw.get("recursive") and isinstance(out.get(k), dict) and isinstance(v, dict):
                out[k] = _combine(out[k], v, recursive=True)
            else:
                out[k] = v
    return out


class RoleVars(object):
    """The variables one role's task sees: ``defaults/``, ``vars/``, then ``overrides``."""

    def __init__(self, role, overrides=None, extra_vars_files=(), data=()):
        """``data``: names of overrides that are data, never templated (as Ansible marks registered results and
        what a module returned unsafe: an object's text may hold ``{{`` or ``{%``)."""
        self.role = role
        self.data = set(data)
        self.role_path = os.path.join(ROOT, "roles", role)
        self.raw = {}
        for sub in ("defaults", "vars"):
            paths = sorted(glob.glob(os.path.join(self.role_path, sub, "main.yml"))
                           + glob.glob(os.path.join(self.role_path, sub, "main", "*.yml")))
            for path in paths + [os.path.join(ROOT, p) for p in extra_vars_files if sub == "vars"]:
                with open(path, encoding="utf-8") as f:
                    self.raw.update(yaml.safe_load(f) or {})
        self.raw.update(overrides or {})
        self.raw.setdefault("role_path", self.role_path)
        self.done, self._compiled = {}, {}
        self.env = NativeEnvironment(undefined=StrictUndefined)
        self.env.filters.update(bool=_bool, combine=_combine, to_json=json.dumps)
        self.env.globals.update(lookup=self._lookup, omit=OMIT)

    def _lookup(self, plugin, *terms, **kw):
        if plugin in ("ansible.builtin.file", "file"):
            with open(os.path.join(self.role_path, "files", terms[0]), encoding="utf-8") as f:
                text = f.read()
            return text if kw.get("rstrip") is False else text.rstrip()
        if plugin in ("ansible.builtin.env", "env"):
            return os.environ.get(terms[0], kw.get("default", ""))
        raise ValueError("lookup %r is not provided by tests/lib/role_tasks.py" % plugin)

    def get(self, name, stack=()):
        if name in self.data:
            return self.raw[name]
        if name not in self.done:
            self.done[name] = self.template(self.raw[name], stack=stack + (name,))
        return self.done[name]

    def template(self, value, extra=None, stack=()):
        """``value`` with every Jinja2 expression evaluated; dict entries and list items that are ``omit`` dropped."""
        extra = extra or {}
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            if value not in self._compiled:
                self._compiled[value] = (meta.find_undeclared_variables(self.env.parse(value)),
                                         self.env.from_string(value))
            refs, compiled = self._compiled[value]
            ctx = dict((r, self.get(r, stack)) for r in refs if r in self.raw and r not in extra and r not in stack)
            ctx.update(extra)
            out = compiled.render(ctx)
            if isinstance(out, Undefined):
                out._fail_with_undefined_error()  # pylint: disable=protected-access
            return out
        if isinstance(value, dict):
            out = dict((k, self.template(v, extra, stack)) for k, v in value.items())
            return dict((k, v) for k, v in out.items() if v != OMIT)
        if isinstance(value, list):
            return [x for x in (self.template(v, extra, stack) for v in value) if x != OMIT]
        return value


def _walk(tasks):
    for task in tasks or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _walk(task.get(key))


@functools.lru_cache(maxsize=None)
def _tasks(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def task(role, module, tasks_file="main.yml", name=None):
    """The task of ``roles/<role>/tasks/<tasks_file>`` that calls ``module`` (the first, or the one named); read-only."""
    tasks = _tasks(os.path.join(ROOT, "roles", role, "tasks", tasks_file))
    for t in _walk(tasks):
        if module in t and (name is None or t.get("name") == name):
            return t
    raise LookupError("no task calling %s in roles/%s/tasks/%s" % (module, role, tasks_file))
