"""A stand-in AWX API v2 on loopback that records what the awx.awx modules send.

AWX cannot run here; ``playbooks/awx_configure.yml`` runs against this instead (``CONTROLLER_HOST=http://127.0.0.1:<port>``,
``CONTROLLER_OAUTH_TOKEN``), and the tests read back every request body. It restates the part of AWX's API that
awx.awx 24.6.1 uses (ansible/awx, tag 24.6.1, ``awx_collection/plugins/module_utils/controller_api.py`` and the
modules named below), nothing more:

* every request goes to ``/api/v2/<endpoint>/`` (``ControllerAPIModule.build_url`` with ``api_path()`` ``/api/``); the
  first answer's ``X-API-Product-Name`` / ``X-API-Product-Version`` headers are the version check (``make_request``);
  ``CONTROLLER_OAUTH_TOKEN`` becomes ``Authorization: Bearer`` (no ``/api/v2/tokens/`` round trip);
* lookups by name are list views filtered by query parameters: ``?name=<name>`` (or ``?or__id=<n>&or__name=<n>`` for
  a name made of digits), further filters such as ``organization=<id>``, ``inventory=<id>``, ``type=job_template``,
  ``identifier=<id>``, ``workflow_job_template=<id>``; the answer has ``count`` and ``results`` (``get_one``), and
  ``next`` for ``get_all_endpoint``;
* create is ``POST`` to the list view (201 with ``id``, ``url``, ``related``), update is ``PATCH`` of the object's
  ``url`` (200); both bodies are what the tests assert;
* associations (credentials, labels, instance_groups, notification_templates_*, galaxy_credentials, the workflow
  nodes' success/failure/always_nodes) are list views under the object's ``related`` URL: ``GET`` lists them,
  ``POST {"id": n}`` associates and ``POST {"id": n, "disassociate": true}`` removes (204) (``modify_associations``);
* a survey is ``POST`` to ``related.survey_spec`` (200), ``GET`` returns it (``job_template.py`` /
  ``workflow_job_template.py`` ``update_survey``);
* a project's creation starts its first sync (``summary_fields.current_update``, polled at ``/project_updates/<id>/``
  by ``project.py`` ``wait_for_project_update``); ``POST`` to an inventory source's ``related.update`` answers 202 with
  an inventory update that ``wait_on_url`` polls until ``finished`` (``inventory_source_update.py``); an inventory
  source's ``status`` is ``never updated`` until its first update, then that of its last update, with
  ``last_update_failed`` (``InventorySource._get_current_status``, ``awx/main/models/inventory.py``);
  ``fail_inventory_updates`` makes the updates fail, as an import of a broken inventory does;
* workflow nodes are found by ``unified_job_templates/?name=&type=&organization=`` and stored at
  ``workflow_job_template_nodes/`` (``workflow_job_template.py`` ``create_workflow_nodes``); an approval node's
  template is ``POST``ed to the node's ``create_approval_template/`` (201; only name, description and timeout are
  kept: ``WorkflowJobTemplateNodeCreateApprovalSerializer``), after which the node's ``unified_job_template`` and
  ``related.unified_job_template`` name it (type ``workflow_approval_template``, so the module's lookup by
  ``type=workflow_approval`` never finds it and it reads it through the node instead, as against AWX). The module
  compares that template with the node's fields (``identifier``, ``workflow_job_template``), which it never has, so
  every run - ``--check`` too - reports the workflow changed, as against AWX. A node's ``DELETE`` removes its edges
  both ways (``success_nodes`` / ``failure_nodes`` / ``always_nodes`` are many-to-many fields of the node itself,
  ``WorkflowNodeBase`` in ``awx/main/models/workflow.py``, whose rows go with it);
* secret inputs (the credential type's ``secret: true`` fields, survey password defaults) read back as
  ``$encrypted$``, as AWX answers them;
* a role is granted as ``awx.awx.role`` grants it: the resource's ``summary_fields.object_roles.<role>_role.id``
  (the roles ``OBJECT_ROLES`` lists per kind, as the API shows them), then ``GET`` / ``POST {"id": n}`` on
  ``/api/v2/roles/<id>/teams/`` (204) (``role.py``); ``role_members`` keeps who holds which role;
* ``/api/v2/ping/`` and ``/api/v2/config/`` answer as a controller does (version, active node).

The managed objects an AWX install has before anything is configured are there from the start: the credential
types Source Control, Machine, OpenShift or Kubernetes API Bearer Token, Container Registry, Ansible Galaxy/Automation
Hub API Token, and the "Ansible Galaxy" credential (``awx/main/models/credential/__init__.py`` ``ManagedCredentialType``,
``awx/main/management/commands/create_preload_data.py``).
"""
from __future__ import annotations

import copy
import http.server
import itertools
import json
import threading
import urllib.parse

VERSION = "24.6.1"
ENCRYPTED = "$encrypted$"

# list endpoint -> the objects' "type"
TYPES = {
    "organizations": "organization", "credential_types": "credential_type", "credentials": "credential",
    "execution_environments": "execution_environment", "projects": "project", "project_updates": "project_update",
    "inventories": "inventory", "inventory_sources": "inventory_source", "inventory_updates": "inventory_update",
    "job_templates": "job_template", "workflow_job_templates": "workflow_job_template",
    "workflow_job_template_nodes": "workflow_job_template_node", "notification_templates": "notification_template",
    "instance_groups": "instance_group", "labels": "label", "users": "user", "teams": "team",
    "workflow_approval_templates": "workflow_approval_template",
}
# unified job templates (/api/v2/unified_job_templates/) are the union of these
UNIFIED = ("job_templates", "workflow_job_templates", "projects", "inventory_sources", "workflow_approval_templates")
ASSOCIATIONS = {
    "organizations": ("instance_groups", "galaxy_credentials", "notification_templates_started",
                      "notification_templates_success", "notification_templates_error",
                      "notification_templates_approvals"),
    "projects": ("notification_templates_started", "notification_templates_success", "notification_templates_error"),
    "inventories": ("instance_groups", "input_inventories"),
    "inventory_sources": ("notification_templates_started", "notification_templates_success",
                          "notification_templates_error"),
    "job_templates": ("credentials", "labels", "instance_groups", "notification_templates_started",
                      "notification_templates_success", "notification_templates_error"),
    "workflow_job_templates": ("labels", "notification_templates_started", "notification_templates_success",
                               "notification_templates_error", "notification_templates_approvals"),
    "workflow_job_template_nodes": ("success_nodes", "failure_nodes", "always_nodes", "credentials", "labels",
                                    "instance_groups"),
}
# endpoint of the objects an association lists
ASSOCIATED = {"galaxy_credentials": "credentials", "input_inventories": "inventories", "success_nodes":
              "workflow_job_template_nodes", "failure_nodes": "workflow_job_template_nodes",
              "always_nodes": "workflow_job_template_nodes"}


# the object roles a resource of each kind has (summary_fields.object_roles; awx/main/models/*.py ImplicitRoleField)
OBJECT_ROLES = {
    "organizations": ("admin", "execute", "project_admin", "inventory_admin", "credential_admin", "workflow_admin",
                      "notification_admin", "job_template_admin", "execution_environment_admin", "auditor", "member",
                      "read", "approval"),
    "job_templates": ("admin", "execute", "read"),
    "workflow_job_templates": ("admin", "execute", "read", "approval"),
    "inventories": ("admin", "update", "adhoc", "use", "read"),
    "credentials": ("admin", "use", "read"),
    "projects": ("admin", "use", "update", "read"),
    "teams": ("admin", "member", "read"),
}
# what an approval template keeps of a create or update body (WorkflowJobTemplateNodeCreateApprovalSerializer)
APPROVAL_FIELDS = ("name", "description", "timeout")


def _target(association):
    """The list endpoint of the objects an association holds."""
    if association.startswith("notification_templates_"):
        return "notification_templates"
    return ASSOCIATED.get(association, association)


MANAGED_CREDENTIAL_TYPES = [
    ("Source Control", "scm", ["username", "password", "ssh_key_data", "ssh_key_unlock"],
     ["password", "ssh_key_data", "ssh_key_unlock"]),
    ("Machine", "ssh", ["username", "password", "ssh_key_data", "ssh_public_key_data", "ssh_key_unlock", "become_method",
                        "become_username", "become_password"],
     ["password", "ssh_key_data", "ssh_key_unlock", "become_password"]),
    ("OpenShift or Kubernetes API Bearer Token", "kubernetes", ["host", "bearer_token", "verify_ssl", "ssl_ca_cert"],
     ["bearer_token"]),
    ("Container Registry", "registry", ["host", "username", "password", "verify_ssl"], ["password"]),
    ("Ansible Galaxy/Automation Hub API Token", "galaxy", ["url", "auth_url", "token"], ["token"]),
]


class StandInAWX:
    """The API state (objects by endpoint), the recorded requests, and the HTTP server serving them."""

    def __init__(self):
        self.objects = {endpoint: {} for endpoint in TYPES}
        self.associations = {}  # (endpoint, id, name) -> [ids]
        self.surveys = {}  # (endpoint, id) -> spec
        self.requests = []  # {"method", "path", "query", "body", "authorization"}
        self._ids = itertools.count(1)
        self._role_ids = itertools.count(1001)
        self.role_members = {}  # (role id, "teams" | "users") -> [ids]
        self.role_of = {}  # role id -> (endpoint, object id, role name)
        self.fail_inventory_updates = False  # the next inventory updates end "failed"
        self._lock = threading.Lock()
        self.server = None
        for name, namespace, fields, secret in MANAGED_CREDENTIAL_TYPES:
            self._create("credential_types", {
                "name": name, "namespace": namespace, "kind": "cloud" if namespace == "kubernetes" else namespace,
                "managed": True, "inputs": {"fields": [dict({"id": f, "type": "string", "label": f},
                                                            **({"secret": True} if f in secret else {}))
                                                       for f in fields]}, "injectors": {}})
        galaxy = self.find("credential_types", "Ansible Galaxy/Automation Hub API Token")
        self._create("credentials", {"name": "Ansible Galaxy", "credential_type": galaxy["id"], "organization": None,
                                     "managed": True, "inputs": {"url": "https://galaxy.ansible.com/"}})

    # ---- state ---------------------------------------------------------------------------------------------
    def find(self, endpoint, name):
        """The object named ``name`` of ``endpoint`` (None when there is none)."""
        for obj in self.objects[endpoint].values():
            if obj.get("name") == name:
                return obj
        return None

    def writes(self, method=None, endpoint=None):
        """Recorded POST/PATCH/DELETE requests (filtered by method and by the list endpoint they address)."""
        out = []
        for r in self.requests:
            if r["method"] == "GET" or (method and r["method"] != method):
                continue
            parts = r["path"].strip("/").split("/")
            if endpoint and (len(parts) < 3 or parts[2] != endpoint):
                continue
            out.append(r)
        return out

    def created(self, endpoint):
        """{name or identifier: body} of every POST that created an object of ``endpoint``."""
        return {(r["body"].get("name") or r["body"].get("identifier")): r["body"] for r in self.writes("POST", endpoint)
                if r["path"].rstrip("/") == "/api/v2/%s" % endpoint}

    def associated(self, endpoint, name, association):
        """Names (identifiers for nodes) of the objects associated with the object ``name``."""
        obj = self.find(endpoint, name)
        target = _target(association)
        ids = self.associations.get((endpoint, obj["id"], association), [])
        return [self.objects[target][i].get("name") or self.objects[target][i].get("identifier") for i in ids]

    def holders(self, endpoint, name, role, actor="teams"):
        """Names of the teams (or users) holding ``role`` on the object ``name`` of ``endpoint``."""
        rid = self.find(endpoint, name)["summary_fields"]["object_roles"]["%s_role" % role]["id"]
        return sorted(self.objects[actor][i]["name"] for i in self.role_members.get((rid, actor), []))

    def survey(self, endpoint, name):
        return self.surveys.get((endpoint, self.find(endpoint, name)["id"]))

    def _create(self, endpoint, data):
        oid = next(self._ids)
        obj = copy.deepcopy(data)
        url = "/api/v2/%s/%d/" % (endpoint, oid)
        related = {a: url + a + "/" for a in ASSOCIATIONS.get(endpoint, ())}
        if endpoint in ("job_templates", "workflow_job_templates"):
            related["survey_spec"] = url + "survey_spec/"
        if endpoint in ("projects", "inventory_sources"):
            related["update"] = url + "update/"
        if endpoint == "workflow_job_template_nodes":
            related["create_approval_template"] = url + "create_approval_template/"
        obj.update(id=oid, type=TYPES[endpoint], url=url, related=related, summary_fields={})
        if endpoint in OBJECT_ROLES:
            roles = {}
            for role in OBJECT_ROLES[endpoint]:
                rid = next(self._role_ids)
                self.role_of[rid] = (endpoint, oid, role)
                roles["%s_role" % role] = {"id": rid, "name": role.replace("_", " ").title()}
            obj["summary_fields"]["object_roles"] = roles
        if endpoint == "inventory_sources":
            obj.update(status="never updated", last_update_failed=False, last_job_run=None)
        if endpoint == "projects":
            obj.setdefault("scm_revision", "")
            update = self._job("project_updates", {"project": oid, "scm_revision": "0" * 40})
            obj["summary_fields"]["current_update"] = {"id": update["id"], "status": update["status"]}
        self.objects[endpoint][oid] = obj
        return obj

    def _job(self, endpoint, data):
        job = self._create(endpoint, dict(data, status="successful", failed=False, finished="2026-01-01T00:00:00Z",
                                          started="2026-01-01T00:00:00Z", elapsed=1.0))
        return job

    def _public(self, endpoint, obj):
        """An object as the API shows it: secret inputs of credentials as $encrypted$."""
        out = copy.deepcopy(obj)
        if endpoint == "credentials" and isinstance(out.get("inputs"), dict):
            ctype = self.objects["credential_types"].get(out.get("credential_type"), {})
            secret = {f["id"] for f in ctype.get("inputs", {}).get("fields", []) if f.get("secret")}
            out["inputs"] = {k: (ENCRYPTED if k in secret and v not in ("", None) else v) for k, v in out["inputs"].items()}
        return out

    # ---- request handling ----------------------------------------------------------------------------------
    def handle(self, method, path, query, body):
        """(status, JSON-able answer) of one request."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] != ["api", "v2"]:
            return 404, {"detail": "Not found."}
        parts = parts[2:]
        if parts == ["ping"]:
            return 200, {"ha": False, "version": VERSION, "active_node": "awx-stand-in", "install_uuid": "0" * 8,
                         "instances": [{"node": "awx-stand-in", "node_type": "hybrid", "capacity": 100}],
                         "instance_groups": [{"name": "default", "capacity": 100, "instances": ["awx-stand-in"]}]}
        if parts == ["config"]:
            return 200, {"version": VERSION, "time_zone": "UTC", "license_info": {}, "project_base_dir": "/var/lib/awx/projects"}
        if parts == ["me"]:
            return 200, {"count": 1, "next": None, "previous": None, "results": [{"id": 1, "username": "admin"}]}
        endpoint = parts[0] if parts else ""
        if endpoint == "roles" and len(parts) == 3 and parts[2] in ("teams", "users"):
            try:
                rid = int(parts[1])
            except ValueError:
                return 404, {"detail": "Not found."}
            if rid not in self.role_of:
                return 404, {"detail": "Not found."}
            members = self.role_members.setdefault((rid, parts[2]), [])
            if method == "GET":
                return 200, self._list([self.objects[parts[2]][i] for i in members], {})
            if method == "POST":
                if body.get("id") not in self.objects[parts[2]]:
                    return 400, {"msg": "no %s with id %r" % (parts[2][:-1], body.get("id"))}
                if body.get("disassociate"):
                    if body["id"] in members:
                        members.remove(body["id"])
                elif body["id"] not in members:
                    members.append(body["id"])
                return 204, None
        if endpoint == "unified_job_templates" and len(parts) == 1 and method == "GET":
            return 200, self._list([o for e in UNIFIED for o in self.objects[e].values()], query)
        if endpoint not in self.objects:
            return 404, {"detail": "Not found."}
        if len(parts) == 1:
            if method == "GET":
                return 200, self._list([self._public(endpoint, o) for o in self.objects[endpoint].values()], query)
            if method == "POST":
                if "name" in body and endpoint != "workflow_job_template_nodes" and any(
                        o.get("name") == body["name"] and o.get("organization") == body.get("organization")
                        for o in self.objects[endpoint].values()):
                    return 400, {"__all__": ["%s with this Name and Organization already exists." % TYPES[endpoint]]}
                return 201, self._public(endpoint, self._create(endpoint, body))
            return 405, {"detail": "Method \"%s\" not allowed." % method}
        try:
            oid = int(parts[1])
            obj = self.objects[endpoint][oid]
        except (ValueError, KeyError):
            return 404, {"detail": "Not found."}
        if len(parts) == 2:
            if method == "GET":
                return 200, self._public(endpoint, obj)
            if method == "PATCH":
                if endpoint == "workflow_approval_templates":  # the serializer's fields only; the rest is ignored
                    body = {k: body[k] for k in APPROVAL_FIELDS if k in body}
                obj.update(copy.deepcopy(body))
                return 200, self._public(endpoint, obj)
            if method == "DELETE":
                del self.objects[endpoint][oid]
                if endpoint == "workflow_job_template_nodes":  # its edges, both ways, go with it (AWX's node delete)
                    for key in [k for k in self.associations if k[0] == endpoint and k[1] == oid]:
                        del self.associations[key]
                    for key, ids in self.associations.items():
                        if key[0] == endpoint and oid in ids:
                            ids.remove(oid)
                return 204, None
            return 405, {"detail": "Method \"%s\" not allowed." % method}
        sub = parts[2]
        if sub == "survey_spec":
            if method == "GET":
                return 200, self.surveys.get((endpoint, oid), {})
            if method == "POST":
                self.surveys[(endpoint, oid)] = copy.deepcopy(body)
                return 200, {}
            if method == "DELETE":
                self.surveys.pop((endpoint, oid), None)
                return 200, {}
        if sub == "update" and method == "POST":
            if endpoint == "projects":
                job = self._job("project_updates", {"project": oid, "scm_revision": "0" * 40})
            else:
                job = self._job("inventory_updates", {"inventory_source": oid})
                if self.fail_inventory_updates:
                    job.update(status="failed", failed=True)
                obj.update(status=job["status"], last_update_failed=job["failed"], last_job_run=job["finished"])
            return 202, dict(self._public(job["url"].split("/")[3], job))
        if sub == "create_approval_template" and endpoint == "workflow_job_template_nodes" and method == "POST":
            approval = self._create("workflow_approval_templates", {k: body[k] for k in APPROVAL_FIELDS if k in body})
            obj["unified_job_template"] = approval["id"]
            obj["related"]["unified_job_template"] = approval["url"]
            return 201, self._public("workflow_approval_templates", approval)
        if sub in ASSOCIATIONS.get(endpoint, ()):
            key = (endpoint, oid, sub)
            current = self.associations.setdefault(key, [])
            if method == "GET":
                target = _target(sub)
                return 200, self._list([self.objects[target][i] for i in current if i in self.objects[target]], {})
            if method == "POST":
                if body.get("disassociate"):
                    if body["id"] in current:
                        current.remove(body["id"])
                elif body["id"] not in current:
                    current.append(body["id"])
                return 204, None
        return 404, {"detail": "Not found."}

    @staticmethod
    def _list(objs, query):
        """A list view filtered as Django REST framework does for these parameters (``or__`` terms are OR'ed)."""
        plain = {k: v for k, v in query.items() if not k.startswith("or__") and k not in ("page", "page_size")}
        either = {k[4:]: v for k, v in query.items() if k.startswith("or__")}

        def matches(o):
            if any(str(o.get(k)) != v and not (v == "" and o.get(k) is None) for k, v in plain.items()):
                return False
            return not either or any(str(o.get(k)) == v for k, v in either.items())

        results = [o for o in objs if matches(o)]
        return {"count": len(results), "next": None, "previous": None, "results": results}

    # ---- server ----------------------------------------------------------------------------------------------
    def start(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self):
                parsed = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                with api._lock:
                    api.requests.append({"method": self.command, "path": parsed.path, "query": query, "body": body,
                                         "authorization": self.headers.get("Authorization")})
                    status, answer = api.handle(self.command, parsed.path, query, body)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-API-Product-Name", "AWX")
                self.send_header("X-API-Product-Version", VERSION)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_HEAD = _serve  # noqa: N815 (http.server's names)

            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
