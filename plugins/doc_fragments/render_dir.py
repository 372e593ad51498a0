# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The output directory of the modules that render Kubernetes objects (module_utils/kube/_render_dir.py).

``llmops.serving.render_dir``: the O(render_dir) option and what check mode and diff mode do with it. Use it
together with ``llmops.serving.attributes``.
"""
from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  render_dir:
    description:
      - Directory the objects are written to as YAML files plus a C(kustomization.yaml) (created when missing).
        Unset - nothing is written and the objects are only returned.
      - The module's warnings (what the render could not check, such as a cluster setting that only apply mode
        reads) are written beside the objects to C(NOTES.txt), which is no resource of the kustomization; it is
        removed when a render has no warnings.
      - Files this module rendered before and no longer produces are removed; they are listed in
        C(.llmops-manifests.json) in that directory. An entry of that file that is absolute, contains C(..) or
        leads through a symlink is refused before anything is written or deleted, and so is a marker that is not
        the JSON this module writes (an object with a C(files) list) - fix or delete the marker. A stale file that is a
        symlink is removed as a link, never followed.
    type: path
attributes:
  check_mode:
    support: full
    details: Reports which files would change without writing them.
  diff_mode:
    support: full
    details:
      - Shows the per-file before and after of O(render_dir), the marker included.
      - The previous content of a file that holds a plain-text credential is not shown.
"""
