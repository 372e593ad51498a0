# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter: the RBAC objects of the automation's two Kubernetes identities (deploy and read-only)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_rbac


def k8s_rbac(namespace, gateway_namespace="aibrix-system", deploy_name=None, read_name=None):
    """ServiceAccounts, Roles, RoleBindings (and the deploy identity's ClusterRole) for ``namespace``."""
    names = {k: v for k, v in ((_k8s_rbac.DEPLOY, deploy_name), (_k8s_rbac.READ, read_name)) if v is not None}
    try:
        return _k8s_rbac.rbac_objects(namespace, gateway_namespace, names)
    except ValueError as e:
        raise AnsibleFilterError("k8s_rbac: %s" % e)


class FilterModule(object):
    def filters(self):
        return {"k8s_rbac": k8s_rbac}
