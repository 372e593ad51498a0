# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The credential inputs of ``awx_configure.yml`` as they were given, never evaluated as templates.

Variables given with ``-e`` (``-e @awx-secrets.vault.yml``) are trusted as templates by ansible-core 2.19
(``ansible/utils/vars.py``, ``load_extra_vars``: ``load_from_file(..., trusted_as_template=True)``), so a password
``x{{ 6*7 }}y`` would be sent as ``x42y`` and one holding ``{#`` would fail the run halfway with the password in the
error. This lookup reads the variables' values as given (a lookup's ``variables`` are not templated) and returns
them marked unsafe (``wrap_var``), which Ansible never templates again: the controller stores them literally.

A value that is only a reference to another variable (``{{ vault_scm_token }}``) is refused, naming the variable
and never the value: the inputs are taken literally, so it would be stored as that text.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: awx_literal_inputs
short_description: The named variables' values as given, marked unsafe (never templated)
description:
  - Returns one mapping of each named variable to its value as given, marked unsafe, so that Jinja in a secret
    (C({{), C({#), C({%)) is stored literally by the controller.
options:
  _terms:
    description: Names of the variables.
    required: true
"""

import re

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible.utils.unsafe_proxy import wrap_var

#: A whole value that only refers to another variable (``{{ vault_scm_token }}``).
_REFERENCE = re.compile(r"^\s*\{\{\s*[A-Za-z_][A-Za-z0-9_.]*\s*\}\}\s*$")


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        out, references = {}, []
        for name in terms:
            if name not in variables:
                raise AnsibleLookupError("awx_literal_inputs: %s is not set; give it with -e or in the vault file "
                                         "(docs/awx.md lists the inputs)" % name)
            value = variables[name]
            if isinstance(value, str) and _REFERENCE.match(value):
                references.append(name)
            out[name] = wrap_var(value)
        if references:
            raise AnsibleLookupError(
                "%s: the value is a reference to another variable ({{ ... }}), but the credential inputs are taken "
                "literally (a secret may contain {{ or {#, which must reach the controller as written); give the "
                "secret itself (in an Ansible Vault file: -e @awx-secrets.vault.yml)" % ", ".join(references))
        return [out]
