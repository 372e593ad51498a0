"""Shared by the molecule scenarios' testinfra tests (molecule/<scenario>/tests/test_*.py).

Every scenario converges localhost and writes only under ``$MOLECULE_EPHEMERAL_DIRECTORY/llmops`` (the
``molecule_root`` of molecule/shared/inventory.yml); the tests read what the role left there through the
testinfra ``host``.
"""
from __future__ import annotations

import json
import os
import struct

import jsonschema
import kubernetes_validate
import pytest
import yaml

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(PROJECT, "tests", "unit", "fixtures")
K8S_VERSION = "1.33.0"
# Custom resources are validated against the upstream CRDs the unit tests vendor; core kinds by kubernetes-validate.
CRDS = {
    ("gateway.networking.k8s.io", "HTTPRoute"): ("schemas/gateway-api-v1.4.1/httproutes.yaml", "v1"),
    ("gateway.networking.k8s.io", "ReferenceGrant"): ("schemas/gateway-api-v1.4.1/referencegrants.yaml", "v1beta1"),
    ("orchestration.aibrix.ai", "StormService"): ("pd/aibrix-v0.7.0/orchestration.aibrix.ai_stormservices.yaml",
                                                  "v1alpha1"),
}


@pytest.fixture(scope="module")
def root():
    eph = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY")
    if not eph:
        pytest.fail("MOLECULE_EPHEMERAL_DIRECTORY is unset: run these tests with `molecule verify` or `molecule test`")
    return os.path.join(eph, "llmops")


class Tree(object):
    """Reads of files on the testinfra host, with the checks every scenario needs."""

    def __init__(self, host):
        self.host = host

    def json(self, path):
        f = self.host.file(path)
        assert f.is_file and not f.is_symlink, "%s is missing or not a regular file" % path
        return json.loads(f.content_string)

    def listdir(self, directory):
        """Every entry of ``directory``, hidden ones included (testinfra's ``File.listdir`` leaves those out)."""
        out = self.host.check_output("find %s -mindepth 1 -maxdepth 1 -printf '%%P\\n'", directory)
        return sorted(line for line in out.splitlines() if line)

    def only_entry(self, directory, what):
        """The single visible entry of ``directory`` (a revision, a fingerprint) and the sorted hidden ones."""
        names = self.listdir(directory)
        visible = [n for n in names if not n.startswith(".")]
        assert len(visible) == 1, "%s: expected one %s, found %s" % (directory, what, sorted(names))
        return visible[0], sorted(n for n in names if n.startswith("."))

    def safetensors_header(self, path):
        """The header dict of a safetensors file, after checking the file's size against it."""
        data = self.host.file(path).content
        assert len(data) >= 8, "%s is shorter than a safetensors length prefix" % path
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n].decode("utf-8"))
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        assert len(data) == 8 + n + max(ends), "%s: size is not 8 + header + the largest data offset" % path
        return header

    def sha256sums(self, path):
        """``{relative path: sha256}`` of a sha256sum-format manifest."""
        out = {}
        for line in self.host.file(path).content_string.splitlines():
            digest, name = line.split("  ", 1)
            out[name] = digest
        return out

    def digests(self, directory):
        """``{relative path: sha256}`` of every regular file below ``directory``, from one ``sha256sum`` run."""
        out = self.host.check_output("cd %s && find . -type f -print0 | sort -z | xargs -0 -r sha256sum", directory)
        return dict((name[2:], digest) for digest, name in (line.split("  ", 1) for line in out.splitlines()))

    def stats(self, directory):
        """``{relative path: (inode, size, mode, device)}`` of the regular files below ``directory`` (one ``find``)."""
        out = self.host.check_output("find %s -type f -printf '%%i %%s %%m %%D %%P\\n'", directory)
        res = {}
        for line in out.splitlines():
            ino, size, mode, dev, name = line.split(" ", 4)
            res[name] = (int(ino), int(size), int(mode, 8), int(dev))
        return res

    def files_below(self, directory):
        """Relative paths of the regular files below ``directory`` (``find -type f``), sorted."""
        out = self.host.check_output("find %s -type f -printf '%%P\\n'", directory)
        return sorted(line for line in out.splitlines() if line)

    def rendered(self, directory):
        """``[(file name, object)]`` of a render_dir in kustomization order, after checking the directory's
        bookkeeping: ``kustomization.yaml`` lists exactly the object files, ``.llmops-manifests.json`` every file
        rendered (the render's warnings in ``NOTES.txt`` too, when it had any), and nothing else is there."""
        names = self.listdir(directory)
        kustomization = yaml.safe_load(self.host.file(directory + "/kustomization.yaml").content_string)
        assert kustomization["kind"] == "Kustomization"
        resources = kustomization["resources"]
        notes = [n for n in names if n == "NOTES.txt"]
        assert sorted(names) == sorted(resources + ["kustomization.yaml", ".llmops-manifests.json"] + notes), names
        assert self.json(directory + "/.llmops-manifests.json") == {
            "files": sorted(resources + ["kustomization.yaml"] + notes)}
        out = []
        for name in resources:
            f = self.host.file("%s/%s" % (directory, name))
            assert f.mode == 0o644, "%s: mode %o" % (name, f.mode)
            docs = [d for d in yaml.safe_load_all(f.content_string) if d is not None]
            assert len(docs) == 1, "%s holds %d objects" % (name, len(docs))
            out.append((name, docs[0]))
        return out


def validate(obj):
    """Validate a Kubernetes object against its schema (raises with the offending field)."""
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    crd = CRDS.get((group, obj["kind"]))
    if crd is None:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        return
    with open(os.path.join(FIXTURES, crd[0])) as f:
        doc = yaml.safe_load(f)
    version = [v for v in doc["spec"]["versions"] if v["name"] == crd[1]][0]
    assert obj["apiVersion"] == "%s/%s" % (group, crd[1])
    jsonschema.validate(obj, version["schema"]["openAPIV3Schema"])


@pytest.fixture
def k8s_validate():
    return validate


@pytest.fixture
def tree(host):
    return Tree(host)
