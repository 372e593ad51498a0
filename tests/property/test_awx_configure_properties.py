"""Property-based checks of the awx.awx comparison rule that makes ``playbooks/awx_configure.yml`` rerunnable.

awx.awx 24.6.1 decides whether to PATCH an object with ``ControllerAPIModule.objects_could_be_different``
(``awx_collection/plugins/module_utils/controller_api.py``), with ``$encrypted$`` (how AWX answers a secret input)
as a wild card through ``fields_could_be_same``, unless ``update_secrets`` is true. The playbook passes
``update_secrets: false`` (``llmops_awx_update_secrets``) and documents secret rotation as an explicit switch. The
invariants, over any credential whose inputs mix secret and plain fields:

* with ``update_secrets: false``, an object the controller holds as it was sent (secrets as ``$encrypted$``) never
  reads as different, and one whose plain field changed always does; a changed secret alone does not (rotation
  needs the switch);
* with ``update_secrets: true`` (awx.awx's default), any object holding a secret always reads as different - the
  changed=6 of every rerun before.

These run the installed awx.awx's own code, so an awx.awx upgrade that changes the rule fails here.
"""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from ansible_collections.awx.awx.plugins.module_utils.controller_api import ControllerAPIModule

ENCRYPTED = ControllerAPIModule.ENCRYPTED_STRING
VALUES = st.text(alphabet="abcdefgh{}#%$ 0123456789", min_size=1, max_size=12).filter(lambda v: v != ENCRYPTED)


class Module:
    """The attributes objects_could_be_different reads, as ControllerAPIModule.__init__ sets them."""

    fields_could_be_same = staticmethod(ControllerAPIModule.fields_could_be_same)
    has_encrypted_values = staticmethod(ControllerAPIModule.has_encrypted_values)

    def __init__(self, update_secrets):
        self.update_secrets = update_secrets

    def _encrypted_changed_warning(self, field, old, warning=False):
        pass


def differs(update_secrets, old, new):
    return ControllerAPIModule.objects_could_be_different(Module(update_secrets), old, new)


@st.composite
def credentials(draw):
    """(inputs sent, names of the secret fields): at least one field."""
    names = draw(st.lists(st.sampled_from(["username", "password", "ssh_key_data", "host", "bearer_token", "token"]),
                          min_size=1, max_size=6, unique=True))
    secret = set(draw(st.lists(st.sampled_from(names), unique=True)))
    return {n: draw(VALUES) for n in names}, secret


def stored(inputs, secret):
    """The object as the controller answers it (awx/main/api/serializers.py: secret inputs as $encrypted$)."""
    return {"name": "c", "description": "d", "inputs": {k: (ENCRYPTED if k in secret else v) for k, v in inputs.items()}}


@settings(max_examples=300, deadline=None)
@given(credentials(), st.data())
def test_without_update_secrets_only_a_changed_plain_field_reads_as_a_change(cred, data):
    inputs, secret = cred
    old = stored(inputs, secret)
    assert not differs(False, old, {"name": "c", "description": "d", "inputs": dict(inputs)})
    field = data.draw(st.sampled_from(sorted(inputs)))
    value = data.draw(VALUES.filter(lambda v: v != inputs[field]))
    changed = {"name": "c", "description": "d", "inputs": dict(inputs, **{field: value})}
    assert differs(False, old, changed) == (field not in secret)
    assert differs(False, old, {"name": "c", "description": "other", "inputs": dict(inputs)})


@settings(max_examples=200, deadline=None)
@given(credentials())
def test_with_update_secrets_a_credential_holding_a_secret_always_reads_as_a_change(cred):
    inputs, secret = cred
    new = {"name": "c", "description": "d", "inputs": dict(inputs)}
    assert differs(True, stored(inputs, secret), new) == bool(secret)
