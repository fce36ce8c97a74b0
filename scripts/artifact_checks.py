#!/usr/bin/env python3
"""YAML plumbing for scripts/check-artifacts.sh (the validators themselves are the real tools).

  rules-file PROMETHEUS_RULE.yaml OUT          the PrometheusRule's spec as a Prometheus rules file
  dashboard-rules DASHBOARD.json OUT           every panel query as a recording rule, for promtool
  alm-examples CSV.yaml OUT                    the CSV's alm-examples as a YAML stream
  same-rbac KUSTOMIZE.yaml HELM.yaml           the rendered Helm chart grants exactly the kustomize RBAC
  no-cluster-rbac RENDERED.yaml                single-namespace output has no cluster RBAC but the metrics'
                                               (and the users' aggregated roles, bound to nothing)
  purge-key NS RENDERED.yaml                   the purge key's Secret ships empty in NS under the name the operator
                                               reads, with a Role of NS on it alone (get, patch) bound to the operator
  user-roles RENDERED.yaml [none]              the users' ClusterRoles on CdnClusters and CdnPurges, with their
                                               rules and aggregation (purging: admin, not edit); none: absent
  crd-for-objects CRD.yaml OUT                 the CRD with the root fields every object has
  all-in-namespace NS RENDERED.yaml            every namespaced object and RBAC subject is in NS
  same-crds RENDERED.yaml CRD.yaml...          the rendered CRDs are these (labels, annotations aside)
  pod-ids none|pinned RENDERED.yaml...         no pod fixes a UID/GID (OpenShift assigns them), or
                                               the operator and the pods it creates are pinned
  no-kind KIND RENDERED.yaml                   no object of KIND (an overlay must not own it)
  kube-prometheus-stack RENDERED.yaml          its ServiceMonitor, PodMonitor and rules are selected by kube-prometheus-stack
  pod-monitor-namespace NS RENDERED.yaml       the PodMonitor scrapes the nginx pods of namespace NS only
  nginx-metrics-image same|none|IMAGE RENDERED.yaml...
                                               the operator's RELATED_IMAGE_NGINX_METRICS is its own image,
                                               absent, or IMAGE
  uninstall-hook RENDERED.yaml [none]          the pre-delete hook Job runs release-finalizers as the
                                               operator's ServiceAccount, over its namespaces (none: no hook)
  catalog-properties [--write]                 olm/catalog's bundle properties are those of bundle/
                                               (--write: regenerate them)
  released ROOT VERSION PREVIOUS               ROOT (a copy of bundle/ and olm/ after scripts/bundle_release.py)
                                               holds release VERSION upgrading from PREVIOUS, every image by digest
  olm-monitoring NS RENDERED.yaml [openshift]  olm/monitoring built for namespace NS: the ServiceMonitor scrapes with
                                               a token Secret of a ServiceAccount bound to the metrics reader (no
                                               token file); openshift: verifies the service CA's certificate of the
                                               bundle's metrics Service, which the Subscription example mounts
  bundle-annotations                           channels agree with the CSV's maturity, and
                                               com.redhat.openshift.versions with its minKubeVersion
  helm-values VALUES.yaml RENDERED.yaml        the chart's conventions (commonLabels, namespaceOverride,
                                               global.imageRegistry, probes, spread, monitoring...) set
                                               in VALUES are in the output
  chart-annotations CHART.yaml RENDERED.yaml CSV.yaml
                                               Artifact Hub's annotations parse as Artifact Hub reads them
                                               and agree with the default render, the CRDs and the CSV
  sbom-covers-lock SBOM.cdx.json Cargo.lock    the CycloneDX SBOM lists every package of Cargo.lock
                                               (name and version)
"""
import json
import os
import re
import sys

import yaml


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def rules_file(src, out):
    (rule,) = docs(src)
    with open(out, "w") as f:
        yaml.safe_dump(rule["spec"], f, sort_keys=False)


def dashboard_rules(src, out):
    with open(src) as f:
        dash = json.load(f)
    rules = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            # Grafana's $__rate_interval is not PromQL; substitute the value Grafana would pick.
            expr = t["expr"].replace("$__rate_interval", "5m")
            rules.append({"record": f"dashboard:panel_{panel['id']}_{t['refId']}", "expr": expr})
    if not rules:
        sys.exit(f"{src}: no panel queries")
    with open(out, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)
    print(f"{len(rules)} dashboard queries")


def alm_examples(src, out):
    (csv,) = docs(src)
    examples = json.loads(csv["metadata"]["annotations"]["alm-examples"])
    with open(out, "w") as f:
        yaml.safe_dump_all(examples, f, sort_keys=False)


def grants(objs, kinds):
    out = set()
    for o in objs:
        if o["kind"] not in kinds:
            continue
        for r in o.get("rules", []):
            for url in r.get("nonResourceURLs", []):
                for v in r.get("verbs", []):
                    out.add((o["kind"], "", url, "", v))
            for g in r.get("apiGroups", []):
                for res in r.get("resources", []):
                    for name in r.get("resourceNames") or [""]:
                        for v in r.get("verbs", []):
                            out.add((o["kind"], g, res, name, v))
    return out


def same_rbac(kustomize, helm):
    k, h = docs(kustomize), docs(helm)
    kinds = {"ClusterRole", "Role"}
    a, b = grants(k, kinds), grants(h, kinds)
    if a != b:
        print(f"RBAC differs between {kustomize} and {helm}")
        for x in sorted(a - b):
            print("  only in kustomize:", x)
        for x in sorted(b - a):
            print("  only in helm:", x)
        sys.exit(1)
    if not a:
        sys.exit("no RBAC rules found")
    print(f"RBAC identical ({len(a)} grants)")


# The only cluster-wide rules single-namespace mode keeps: the secured /metrics' delegated
# authentication and authorization (cluster-scoped reviews), and the metrics-reader role for
# scrapers. Neither touches any object.
METRICS_CLUSTER_GRANTS = {
    ("ClusterRole", "authentication.k8s.io", "tokenreviews", "", "create"),
    ("ClusterRole", "authorization.k8s.io", "subjectaccessreviews", "", "create"),
    ("ClusterRole", "", "/metrics", "", "get"),
}


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def aggregated(o):
    """The built-in roles (admin, edit, view) a ClusterRole is aggregated into."""
    return {k[len(AGGREGATE):] for k, v in (o["metadata"].get("labels") or {}).items()
            if k.startswith(AGGREGATE) and v == "true"}


def no_cluster_rbac(path):
    objs = docs(path)
    # The users' roles extend admin/edit/view wherever those are bound; bound to nothing here, they
    # grant the operator nothing (checked below).
    user_roles = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole" and aggregated(o)}
    extra = grants([o for o in objs if o["metadata"]["name"] not in user_roles],
                   {"ClusterRole"}) - METRICS_CLUSTER_GRANTS
    if extra:
        sys.exit(f"{path}: single-namespace mode still has cluster RBAC beyond the metrics: {sorted(extra)}")
    roles = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole"}
    bad = [o["metadata"]["name"] for o in objs
           if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] not in roles]
    if bad:
        sys.exit(f"{path}: single-namespace mode binds cluster roles it does not ship: {bad}")
    if not any(o["kind"] == "Role" and o["metadata"]["name"].endswith("cdn-operator") for o in docs(path)):
        sys.exit(f"{path}: no Role for the operator")
    bound = [o["metadata"]["name"] for o in objs
             if o["kind"] in ("RoleBinding", "ClusterRoleBinding") and o["roleRef"]["name"] in user_roles]
    if bound:
        sys.exit(f"{path}: the users' roles are bound: {bound}")


# The operator reads its purge key from this Secret of its own namespace (src/purge/signing.rs).
PURGE_KEY_SECRET = "cdn-operator-purge-signing"


def purge_key(ns, path):
    objs = docs(path)
    secrets = [o for o in objs if o["kind"] == "Secret" and "purge-signing" in o["metadata"]["name"]]
    if [(o["metadata"]["name"], o["metadata"].get("namespace")) for o in secrets] != [(PURGE_KEY_SECRET, ns)]:
        sys.exit(f"{path}: the purge key's Secret is {[(o['metadata']['name'], o['metadata'].get('namespace')) for o in secrets]}, "
                 f"want {PURGE_KEY_SECRET} in {ns} (the operator reads that name)")
    (secret,) = secrets
    if secret.get("type") != "Opaque" or any(k in secret for k in ("data", "stringData", "immutable")):
        sys.exit(f"{path}: the purge key's Secret is not shipped empty: {secret}")
    account = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    want = {("Role", "", "secrets", PURGE_KEY_SECRET, v) for v in ("get", "patch")}
    roles = [o for o in objs if o["kind"] == "Role" and o["metadata"].get("namespace") == ns
             and grants([o], {"Role"}) == want]
    bound = [b for b in objs if b["kind"] == "RoleBinding" and b["metadata"].get("namespace") == ns
             and b["roleRef"]["name"] in {r["metadata"]["name"] for r in roles}
             and {"kind": "ServiceAccount", "name": account, "namespace": ns} in b["subjects"]]
    if len(roles) != 1 or len(bound) != 1:
        sys.exit(f"{path}: {len(roles)} Role(s) of {ns} granting exactly get and patch on {PURGE_KEY_SECRET}, "
                 f"{len(bound)} binding it to {account}: want one each")
    secret_grants = {g for g in grants(objs, {"Role", "ClusterRole"}) if g[2] == "secrets"}
    if secret_grants != want:
        sys.exit(f"{path}: rights on Secrets beyond the purge key's: {sorted(secret_grants - want)}")
    print(f"{path}: {PURGE_KEY_SECRET} ships empty in {ns}; the operator may get and patch it, no other Secret")


# The users' roles (kustomize/base/cdn*_role.yaml, helm templates/user-roles.yaml), by name suffix:
# their grants and the built-in roles they are aggregated into.
USER_ROLES = {
    "cdncluster-editor": ({("cluster.anevia.com", "cdnclusters", v) for v in
                           ("create", "get", "list", "watch", "update", "patch", "delete")}
                          | {("cluster.anevia.com", "cdnclusters/status", "get")}
                          | {("cluster.anevia.com", "cdnclusters/scale", v) for v in ("get", "update", "patch")},
                          {"admin", "edit"}),
    "cdncluster-viewer": ({("cluster.anevia.com", "cdnclusters", v) for v in ("get", "list", "watch")},
                          {"admin", "edit", "view"}),
    # Who may purge is not who may edit: admin only.
    "cdnpurge-editor": ({("cluster.anevia.com", "cdnpurges", v) for v in ("create", "get", "list", "watch", "delete")}
                        | {("cluster.anevia.com", "cdnpurges/status", "get")},
                        {"admin"}),
    "cdnpurge-viewer": ({("cluster.anevia.com", "cdnpurges", v) for v in ("get", "list", "watch")},
                        {"admin", "edit", "view"}),
}


def user_roles(path, mode="present"):
    objs = [o for o in docs(path) if o["kind"] == "ClusterRole" and aggregated(o)]
    if mode == "none":
        if objs:
            sys.exit(f"{path}: aggregated roles rendered: {[o['metadata']['name'] for o in objs]}")
        print(f"{path}: no users' roles")
        return
    found = {}
    for o in objs:
        suffix = next((s for s in USER_ROLES if o["metadata"]["name"].endswith("-" + s)), None)
        if suffix is None:
            sys.exit(f"{path}: an aggregated ClusterRole that is not a users' role: {o['metadata']['name']}")
        got = {(g, res, v) for (_, g, res, name, v) in grants([o], {"ClusterRole"}) if not name}
        want, into = USER_ROLES[suffix]
        if got != want or aggregated(o) != into or any(r.get("resourceNames") for r in o["rules"]):
            sys.exit(f"{path}: {o['metadata']['name']}: grants {sorted(got)} into {sorted(aggregated(o))}, "
                     f"want {sorted(want)} into {sorted(into)}")
        found[suffix] = o
    if set(found) != set(USER_ROLES):
        sys.exit(f"{path}: users' roles {sorted(found)}, want {sorted(USER_ROLES)}")
    print(f"{path}: the users' roles, purging aggregated into admin only")


def crd_for_objects(src, out):
    # The API server accepts apiVersion, kind and metadata on every object; generated schemas
    # leave them out, and crd_validate.py rejects unknown fields at the root.
    (crd,) = docs(src)
    for v in crd["spec"]["versions"]:
        props = v["schema"]["openAPIV3Schema"].setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    with open(out, "w") as f:
        yaml.safe_dump(crd, f, sort_keys=False)


def all_in_namespace(ns, path):
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    bad = []
    for o in docs(path):
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] not in cluster_scoped and o["metadata"].get("namespace") != ns:
            bad.append(f"{name} in {o['metadata'].get('namespace')}")
        for subject in o.get("subjects", []):
            if subject.get("kind") == "ServiceAccount" and subject.get("namespace") != ns:
                bad.append(f"{name} binds {subject}")
    if bad:
        sys.exit(f"{path}: not everything is in {ns}: {bad}")
    print(f"everything in namespace {ns}")


def same_crds(rendered, *crd_files):
    got = {}
    for o in docs(rendered):
        if o["kind"] == "CustomResourceDefinition":
            o["metadata"].pop("labels", None)
            o["metadata"].pop("annotations", None)
            got[o["metadata"]["name"]] = o
    want = {}
    for path in crd_files:
        (crd,) = docs(path)
        want[crd["metadata"]["name"]] = crd
    if got != want:
        sys.exit(f"{rendered}: the CRDs differ from {', '.join(crd_files)}")
    print(f"{len(got)} CRDs rendered as generated")


ID_FIELDS = ("runAsUser", "runAsGroup", "fsGroup")
POD_ID_FLAGS = ("--pod-run-as-user=", "--pod-run-as-group=", "--pod-fs-group=")


def pod_specs(o):
    """(name, pod spec) of every pod an object runs: Pods, workloads' templates, a CSV's deployments."""
    name = f"{o['kind']}/{o['metadata']['name']}"
    if o["kind"] == "Pod":
        yield name, o["spec"]
    elif o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        yield name, o["spec"]["template"]["spec"]
    elif o["kind"] == "ClusterServiceVersion":
        for d in o["spec"]["install"]["spec"]["deployments"]:
            yield f"{name} deployment {d['name']}", d["spec"]["template"]["spec"]


def pod_ids(mode, *paths):
    operators = 0
    for path in paths:
        for o in docs(path):
            for name, spec in pod_specs(o):
                psc = spec.get("securityContext") or {}
                if psc.get("runAsNonRoot") is not True:
                    sys.exit(f"{path}: {name}: the pod does not set runAsNonRoot: true")
                fixed = {f"pod {k}": psc[k] for k in ID_FIELDS if k in psc}
                flags = []
                for c in spec["containers"]:
                    csc = c.get("securityContext") or {}
                    fixed.update({f"{c['name']} {k}": csc[k] for k in ID_FIELDS if k in csc})
                    flags += [a for a in c.get("args", []) if a.startswith(POD_ID_FLAGS)]
                operator = any(c.get("args", [])[:1] == ["run"] for c in spec["containers"])
                operators += operator
                if mode == "none" and (fixed or flags):
                    sys.exit(f"{path}: {name} fixes ids (OpenShift's restricted-v2 refuses them): {fixed} {flags}")
                if mode == "pinned" and operator:
                    if "pod runAsUser" not in fixed or len(flags) != len(POD_ID_FLAGS):
                        sys.exit(f"{path}: {name}: asked for pinned ids, got {fixed} {flags}")
    if not operators:
        sys.exit(f"{' '.join(paths)}: no operator Deployment found")
    print(f"pod ids: {mode} ({operators} operator deployments)")


def no_kind(kind, path):
    found = [o["metadata"]["name"] for o in docs(path) if o["kind"] == kind]
    if found:
        sys.exit(f"{path}: has {kind} {found}")
    print(f"no {kind} in {path}")


# The labels of every CdnCluster nginx pod that the PodMonitor selects them by (src/cdncluster/build.rs).
NGINX_POD_LABELS = {"app.kubernetes.io/name": "cdncluster", "app.kubernetes.io/managed-by": "cdn-operator"}
# The metrics sidecar's endpoint (docs/cdn-metrics.txt).
NGINX_METRICS_ENDPOINT = {"port": "metrics", "path": "/metrics"}


def pod_monitor_problems(o):
    name = f"PodMonitor/{o['metadata']['name']}"
    bad = []
    if o["spec"].get("selector") != {"matchLabels": NGINX_POD_LABELS}:
        bad.append(f"{name} selects {o['spec'].get('selector')}, not the nginx pods {NGINX_POD_LABELS}")
    endpoints = o["spec"].get("podMetricsEndpoints", [])
    if len(endpoints) != 1 or {k: endpoints[0].get(k) for k in NGINX_METRICS_ENDPOINT} != NGINX_METRICS_ENDPOINT:
        bad.append(f"{name} scrapes {endpoints}, not {NGINX_METRICS_ENDPOINT}")
    return bad


def kube_prometheus_stack(path):
    # kube-prometheus-stack's Prometheus selects `release: <its release>` (kube-prometheus-stack
    # by default); honorLabels keeps the domain gauges' namespace as `namespace`. The PodMonitor
    # of the nginx pods keeps Prometheus's `namespace` and `pod` (the sidecar sets neither).
    found, bad = [], []
    for o in docs(path):
        if o["kind"] not in ("ServiceMonitor", "PrometheusRule", "PodMonitor"):
            continue
        found.append(o["kind"])
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["metadata"].get("labels", {}).get("release") != "kube-prometheus-stack":
            bad.append(f"{name} lacks release: kube-prometheus-stack")
        for e in o["spec"].get("endpoints", []) if o["kind"] == "ServiceMonitor" else []:
            if e.get("honorLabels") is not True:
                bad.append(f"{name} endpoint {e.get('port')} without honorLabels: true")
        if o["kind"] == "PodMonitor":
            bad += pod_monitor_problems(o)
            if o["spec"].get("namespaceSelector") != {"any": True}:
                bad.append(f"{name}: a cluster-wide install scrapes every namespace, not {o['spec'].get('namespaceSelector')}")
    if sorted(found) != ["PodMonitor", "PrometheusRule", "ServiceMonitor"] or bad:
        sys.exit(f"{path}: {sorted(found)} (want one PodMonitor, PrometheusRule and ServiceMonitor); {bad}")
    print(f"{path}: ServiceMonitor, PodMonitor and PrometheusRule selected by kube-prometheus-stack")


def pod_monitor_namespace(ns, path):
    # Single-namespace mode: the operator's CdnClusters, and so the nginx pods, are in NS alone.
    monitors = [o for o in docs(path) if o["kind"] == "PodMonitor"]
    if len(monitors) != 1:
        sys.exit(f"{path}: {len(monitors)} PodMonitors (want 1)")
    (o,) = monitors
    bad = pod_monitor_problems(o)
    selector = o["spec"].get("namespaceSelector") or {}
    own = o["metadata"].get("namespace")
    # No selector (or any: false without names) means the PodMonitor's own namespace.
    if selector.get("any"):
        bad.append(f"namespaceSelector {selector} scrapes every namespace")
    elif selector.get("matchNames"):
        if selector["matchNames"] != [ns]:
            bad.append(f"namespaceSelector {selector} is not [{ns}]")
    elif own != ns:
        bad.append(f"it scrapes its own namespace {own}, not {ns}")
    if bad:
        sys.exit(f"{path}: {bad}")
    print(f"{path}: the PodMonitor scrapes namespace {ns} only")


NGINX_METRICS_ENV = "RELATED_IMAGE_NGINX_METRICS"


def nginx_metrics_image(want, *paths):
    # The operator's Deployment (or the CSV's): env RELATED_IMAGE_NGINX_METRICS of container
    # `operator` is the container's own image (same), absent (none), or `want`.
    checked = 0
    for path in paths:
        for o in docs(path):
            for name, spec in pod_specs(o):
                for c in spec["containers"]:
                    if c.get("args", [])[:1] != ["run"]:
                        continue
                    checked += 1
                    values = [e.get("value") for e in c.get("env", []) if e["name"] == NGINX_METRICS_ENV]
                    expected = {"same": [c["image"]], "none": []}.get(want, [want])
                    if values != expected:
                        sys.exit(f"{path}: {name}: {NGINX_METRICS_ENV} is {values}, want {expected} "
                                 f"(the operator's image is {c['image']})")
    if not checked:
        sys.exit(f"{' '.join(paths)}: no operator container found")
    print(f"{NGINX_METRICS_ENV}: {want} ({checked} operator containers)")


BUNDLE = "bundle/manifests"
CATALOG = "olm/catalog/cdn-operator/catalog.yaml"
PROPERTIES_NOTE = ("# Generated from bundle/manifests by `scripts/artifact_checks.py catalog-properties --write`:\n"
                   "# what `opm render` writes for a bundle image (operator-registry's\n"
                   "# ObjectsAndPropertiesFromBundle), sorted by type, then value.\n")

# operator-registry's property.CSVMetadata: its JSON key, and where the CSV holds the value.
CSV_METADATA = [
    ("annotations", ("metadata", "annotations")),
    ("apiServiceDefinitions", ("spec", "apiservicedefinitions")),
    ("crdDescriptions", ("spec", "customresourcedefinitions")),
    ("description", ("spec", "description")),
    ("displayName", ("spec", "displayName")),
    ("installModes", ("spec", "installModes")),
    ("keywords", ("spec", "keywords")),
    ("labels", ("metadata", "labels")),
    ("links", ("spec", "links")),
    ("maintainers", ("spec", "maintainers")),
    ("maturity", ("spec", "maturity")),
    ("minKubeVersion", ("spec", "minKubeVersion")),
    ("nativeAPIs", ("spec", "nativeAPIs")),
    ("provider", ("spec", "provider")),
]


def bundle_properties(manifests=BUNDLE):
    """olm.csv.metadata, olm.gvk (each owned CRD version served), olm.package: the properties
    opm renders for a bundle with an image (olm.bundle.object only when it has none)."""
    csvs, crds = [], []
    for name in sorted(os.listdir(manifests)):
        for d in docs(os.path.join(manifests, name)):
            {"ClusterServiceVersion": csvs, "CustomResourceDefinition": crds}.get(d["kind"], []).append(d)
    if len(csvs) != 1:
        sys.exit(f"{manifests}: expected one ClusterServiceVersion, found {len(csvs)}")
    csv = csvs[0]
    owned = {c["name"] for c in csv["spec"].get("customresourcedefinitions", {}).get("owned", [])}
    with open("bundle/metadata/annotations.yaml") as f:
        package = yaml.safe_load(f)["annotations"]["operators.operatorframework.io.bundle.package.v1"]
    metadata = {}
    for key, (part, field) in CSV_METADATA:
        value = csv.get(part, {}).get(field)
        if value or key == "provider":  # Go's omitempty, which does not apply to a struct
            metadata[key] = value or {}
    props = [{"type": "olm.csv.metadata", "value": metadata},
             {"type": "olm.package", "value": {"packageName": package, "version": csv["spec"]["version"]}}]
    for crd in crds:
        if crd["metadata"]["name"] not in owned:
            sys.exit(f"{manifests}: the CSV does not own the CRD {crd['metadata']['name']}")
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                props.append({"type": "olm.gvk", "value": {
                    "group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": v["name"]}})
    props.sort(key=lambda p: (p["type"], json.dumps(p["value"], sort_keys=True, separators=(",", ":"))))
    return props


class _Dumper(yaml.SafeDumper):
    # Sequences indented under their key, as in the rest of the catalog.
    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def catalog_properties(*flags):
    # The bundle of bundle/ is the catalog's last document and its properties its last key: they
    # run from the last note above `properties:` to the end of the file (the bundles of earlier
    # releases keep theirs, scripts/bundle_release.py).
    with open(CATALOG) as f:
        text = f.read()
    head, sep, _ = text.rpartition(PROPERTIES_NOTE)
    if not sep:
        sys.exit(f"{CATALOG}: no generated properties (the note `{PROPERTIES_NOTE.splitlines()[0]}` ends the file)")
    want = head + PROPERTIES_NOTE + yaml.dump({"properties": bundle_properties()}, Dumper=_Dumper,
                                              sort_keys=False, width=1000, allow_unicode=True)
    if flags == ("--write",):
        with open(CATALOG, "w") as f:
            f.write(want)
        print(f"wrote the bundle properties of {CATALOG}")
    elif flags:
        sys.exit(f"catalog-properties: unknown arguments {flags}")
    elif text != want:
        sys.exit(f"{CATALOG}: the bundle properties are not those of {BUNDLE}: "
                 "run scripts/artifact_checks.py catalog-properties --write")
    else:
        print(f"{CATALOG}: bundle properties match {BUNDLE}")


DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def released(root, version, previous):
    """The upgrade policy of docs/upgrading.md, as scripts/bundle_release.py writes it."""
    os.chdir(root)
    csv = next(d for d in docs(os.path.join(BUNDLE, "cdn-operator.clusterserviceversion.yaml")))
    problems = []
    want = {"name": f"cdn-operator.v{version}", "version": version, "replaces": f"cdn-operator.v{previous}",
            "skipRange": f">=0.1.0 <{version}"}
    got = {"name": csv["metadata"]["name"], "version": csv["spec"]["version"],
           "replaces": csv["spec"].get("replaces"), "skipRange": csv["metadata"]["annotations"].get("olm.skipRange")}
    problems += [f"CSV {k}: {got[k]!r}, want {want[k]!r}" for k in want if got[k] != want[k]]
    images = [("containerImage", csv["metadata"]["annotations"].get("containerImage"))]
    images += [(f"relatedImages {i['name']}", i["image"]) for i in csv["spec"]["relatedImages"]]
    for d in csv["spec"]["install"]["spec"]["deployments"]:
        for c in d["spec"]["template"]["spec"]["containers"]:
            images.append((f"container {c['name']}", c["image"]))
            images += [(f"env {e['name']}", e.get("value")) for e in c.get("env", []) if e["name"].startswith("RELATED_IMAGE_")]
    catalog = list(docs(CATALOG))
    bundle = [d for d in catalog if d.get("schema") == "olm.bundle" and d["name"] == want["name"]]
    if len(bundle) != 1:
        problems.append(f"{CATALOG}: {len(bundle)} bundles named {want['name']}")
    else:
        images.append(("catalog bundle image", bundle[0]["image"]))
        images += [(f"catalog relatedImages {i['name']!r}", i["image"]) for i in bundle[0]["relatedImages"]]
        missing = {i["image"] for i in csv["spec"]["relatedImages"]} - {i["image"] for i in bundle[0]["relatedImages"]}
        problems += [f"catalog relatedImages lack {m}" for m in sorted(missing)]
    problems += [f"{where} is not pinned by digest: {ref}" for where, ref in images if not DIGEST.match(ref or "")]
    if not any(d.get("schema") == "olm.bundle" and d["name"] == want["replaces"] for d in catalog):
        problems.append(f"{CATALOG}: the previous release {want['replaces']} is gone")
    with open("bundle/metadata/annotations.yaml") as f:
        channels = yaml.safe_load(f)["annotations"]["operators.operatorframework.io.bundle.channels.v1"].split(",")
    for channel in channels:
        doc = [d for d in catalog if d.get("schema") == "olm.channel" and d["name"] == channel]
        entries = [e for d in doc for e in d["entries"] if e["name"] == want["name"]]
        if entries != [{"name": want["name"], "replaces": want["replaces"], "skipRange": want["skipRange"]}]:
            problems.append(f"channel {channel}: entry {entries}, want replaces and skipRange as in the CSV")
    if problems:
        sys.exit(f"{root}: release {version}:\n  " + "\n  ".join(problems))
    catalog_properties()
    print(f"ok {root}: {want['name']} replaces {want['replaces']}, skipRange {want['skipRange']}, "
          f"{len(images)} image references by digest")


def olm_monitoring(ns, path, variant="prometheus-operator"):
    objs = docs(path)
    by = lambda kind: [o for o in objs if o["kind"] == kind]
    problems = [f"{o['kind']}/{o['metadata']['name']} is in {o['metadata'].get('namespace')}, not {ns}"
                for o in objs if o["kind"] != "ClusterRoleBinding" and o["metadata"].get("namespace") != ns]
    secrets = {o["metadata"]["name"]: o for o in by("Secret")}
    bound = {(s["namespace"], s["name"]) for b in by("ClusterRoleBinding")
             if b["roleRef"]["name"] == "cdn-operator-metrics-reader" for s in b["subjects"] if s["kind"] == "ServiceAccount"}
    service = docs("bundle/manifests/cdn-operator-metrics.service.yaml")[0]
    (monitor,) = by("ServiceMonitor")
    for e in monitor["spec"]["endpoints"]:
        if "bearerTokenFile" in e:
            problems.append("bearerTokenFile: OpenShift's user-workload monitoring refuses it")
        cred = e.get("authorization", {}).get("credentials", {})
        secret = secrets.get(cred.get("name"))
        if not secret or secret["type"] != "kubernetes.io/service-account-token" or cred.get("key") != "token":
            problems.append(f"authorization.credentials {cred}: not the token of a service-account-token Secret of the set")
        elif (ns, secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]) not in bound:
            problems.append(f"{secret['metadata']['name']}'s ServiceAccount is not bound to cdn-operator-metrics-reader in {ns}")
        if e.get("scheme") != "https":
            problems.append("the operator serves /metrics over HTTPS only")
        tls = e.get("tlsConfig", {})
        if variant == "openshift":
            ca = tls.get("ca", {}).get("configMap", {})
            cms = [c for c in by("ConfigMap") if c["metadata"]["name"] == ca.get("name")]
            if ca.get("key") != "service-ca.crt" or not cms or \
                    cms[0]["metadata"].get("annotations", {}).get("service.beta.openshift.io/inject-cabundle") != "true":
                problems.append(f"tlsConfig.ca {ca}: not the ConfigMap the service CA injects")
            if tls.get("insecureSkipVerify") or tls.get("serverName") != f"{service['metadata']['name']}.{ns}.svc":
                problems.append(f"tlsConfig {tls}: must verify {service['metadata']['name']}.{ns}.svc")
            cert = service["metadata"].get("annotations", {}).get("service.beta.openshift.io/serving-cert-secret-name")
            sub = docs("olm/examples/subscription_openshift.yaml")[0]["spec"]["config"]
            volumes = {v["name"] for v in sub["volumes"] if v.get("secret", {}).get("secretName") == cert}
            mounts = {m["mountPath"] for m in sub["volumeMounts"] if m["name"] in volumes}
            env = {x["name"]: x.get("value") for x in sub["env"]}
            if not cert or env.get("METRICS_CERT_DIR") not in mounts:
                problems.append(f"the operator does not serve the service CA's certificate (Secret {cert}): "
                                f"subscription_openshift.yaml mounts {mounts}, METRICS_CERT_DIR {env.get('METRICS_CERT_DIR')}")
    if problems:
        sys.exit(f"{path}:\n  " + "\n  ".join(problems))
    print(f"ok {path}: {variant} monitoring of {ns}, token from Secret, "
          + ("service CA verified" if variant == "openshift" else "TLS not verified (self-signed)"))


# OpenShift 4.N runs Kubernetes 1.(N+13) (4.14: 1.27 ... 4.17: 1.30).
OPENSHIFT_KUBE_OFFSET = 13


def bundle_annotations():
    with open("bundle/metadata/annotations.yaml") as f:
        annotations = yaml.safe_load(f)["annotations"]
    csv = next(d for d in docs(os.path.join(BUNDLE, "cdn-operator.clusterserviceversion.yaml")))
    catalog = list(docs(CATALOG))
    problems = []
    channels = annotations["operators.operatorframework.io.bundle.channels.v1"].split(",")
    default = annotations["operators.operatorframework.io.bundle.channel.default.v1"]
    maturity = csv["spec"]["maturity"]
    # A channel named after a maturity (alpha, beta, stable) carries bundles of that maturity.
    if channels != [maturity]:
        problems.append(f"channels {channels} but the CSV's maturity is {maturity}")
    if default not in channels:
        problems.append(f"default channel {default} is not one of {channels}")
    package = next(d for d in catalog if d.get("schema") == "olm.package")
    if package["defaultChannel"] != default:
        problems.append(f"{CATALOG}: defaultChannel {package['defaultChannel']}, bundle's {default}")
    in_catalog = {d["name"] for d in catalog if d.get("schema") == "olm.channel"
                  and any(e["name"] == csv["metadata"]["name"] for e in d["entries"])}
    if in_catalog != set(channels):
        problems.append(f"{CATALOG}: {csv['metadata']['name']} is in channels {sorted(in_catalog)}, bundle's {channels}")
    for path in ["olm/examples/subscription.yaml", "olm/examples/subscription_openshift.yaml"]:
        sub = docs(path)[0]
        if sub["spec"]["channel"] != default:
            problems.append(f"{path}: channel {sub['spec']['channel']}, bundle's {default}")
    versions = str(annotations.get("com.redhat.openshift.versions", ""))
    m = re.fullmatch(r"v4\.(\d+)", versions)
    kube = re.fullmatch(r"1\.(\d+)\.\d+", csv["spec"]["minKubeVersion"])
    if not m:
        problems.append(f"com.redhat.openshift.versions {versions!r}: want \"v4.N\" (4.N and later)")
    elif int(m.group(1)) + OPENSHIFT_KUBE_OFFSET != int(kube.group(1)):
        problems.append(f"com.redhat.openshift.versions {versions} runs Kubernetes 1.{int(m.group(1)) + OPENSHIFT_KUBE_OFFSET}, "
                        f"the CSV's minKubeVersion is {csv['spec']['minKubeVersion']}")
    if problems:
        sys.exit("bundle annotations:\n  " + "\n  ".join(problems))
    print(f"ok bundle annotations: channel {default} = maturity {maturity}, OpenShift {versions} = Kubernetes {csv['spec']['minKubeVersion']}")


def helm_values(values_path, path):
    # Each convention of tests/helm/values-all-features.yaml, as the objects carry it.
    with open(values_path) as f:
        v = yaml.safe_load(f)
    objs = docs(path)
    bad = []

    def one(kind, name_suffix=""):
        found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
        if len(found) != 1:
            bad.append(f"{len(found)} {kind} *{name_suffix} (want 1)")
            return {"metadata": {}, "spec": {}}
        return found[0]

    def want(what, got, expected):
        if got != expected:
            bad.append(f"{what}: {got!r}, want {expected!r}")

    for o in objs:
        labels = o["metadata"].get("labels") or {}
        if o["metadata"]["name"].endswith(("-extra", "-extra-string")):
            # The user's objects, rendered through tpl, carry the user's labels.
            if "{{" in yaml.safe_dump(o):
                bad.append(f"{o['kind']}/{o['metadata']['name']}: an unrendered template")
            continue
        for k, val in (v.get("commonLabels") or {}).items():
            want(f"{o['kind']}/{o['metadata']['name']} label {k}", labels.get(k), val)
    ns = v.get("namespaceOverride")
    deploy = one("Deployment")
    pod = deploy["spec"].get("template", {}).get("spec", {})
    if ns:
        for kind in ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"):
            want(f"{kind} namespace", one(kind)["metadata"].get("namespace"), ns)
        for o in objs:
            for s in o.get("subjects", []):
                if s["kind"] == "ServiceAccount" and s["name"] == pod.get("serviceAccountName"):
                    want(f"{o['kind']}/{o['metadata']['name']} subject namespace", s.get("namespace"), ns)
    for k, val in (v.get("deploymentAnnotations") or {}).items():
        want(f"Deployment annotation {k}", deploy["metadata"].get("annotations", {}).get(k), val)
    if v.get("strategy"):
        want("Deployment strategy", deploy["spec"].get("strategy"), v["strategy"])
    if "revisionHistoryLimit" in v:
        want("Deployment revisionHistoryLimit", deploy["spec"].get("revisionHistoryLimit"), v["revisionHistoryLimit"])
    want("pod automountServiceAccountToken", pod.get("automountServiceAccountToken"), True)
    selector = {"matchLabels": {**deploy["spec"].get("selector", {}).get("matchLabels", {})}}
    # None set: the replicas on different nodes where they can be.
    constraints = v.get("topologySpreadConstraints") or [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}]
    expected = [c if "labelSelector" in c else {**c, "labelSelector": selector} for c in constraints]
    want("topologySpreadConstraints", pod.get("topologySpreadConstraints"), expected)
    containers = {c["name"]: c for c in pod.get("containers", [])}
    operator = containers.get("operator", {})
    registry = (v.get("global") or {}).get("imageRegistry")
    if registry:
        for name, spec in [p for o in objs for p in pod_specs(o)]:
            for c in spec["containers"]:
                if not c["image"].startswith(registry + "/"):
                    bad.append(f"{name} {c['name']}: image {c['image']} not from global.imageRegistry {registry}")
        want("operator image", operator.get("image", "").split("@")[0].split(":")[0], f"{registry}/{v['image']['repository']}")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe not in v:
            continue
        got = operator.get(probe)
        if not v[probe]["enabled"]:
            want(probe, got, None)
            continue
        timings = {k: x for k, x in v[probe].items() if k != "enabled"}
        want(f"{probe} timings", {k: (got or {}).get(k) for k in timings}, timings)
        if not (got or {}).get("httpGet"):
            bad.append(f"{probe}: no httpGet handler")
    pdb_values = v.get("podDisruptionBudget") or {}
    if pdb_values.get("enabled"):
        pdb = one("PodDisruptionBudget")["spec"]
        for k in ("minAvailable", "maxUnavailable"):
            want(f"PodDisruptionBudget {k}", pdb.get(k), pdb_values.get(k, 1 if k == "maxUnavailable" and "minAvailable" not in pdb_values else None))
    for sa in (o for o in objs if o["kind"] == "ServiceAccount"):
        want("ServiceAccount automountServiceAccountToken", sa.get("automountServiceAccountToken"),
             (v.get("serviceAccount") or {}).get("automountServiceAccountToken", True))
    sm_values = (v.get("metrics") or {}).get("serviceMonitor") or {}
    if sm_values.get("enabled"):
        sm = one("ServiceMonitor")
        release_ns = deploy["metadata"].get("namespace")
        if sm_values.get("namespace"):
            want("ServiceMonitor namespace", sm["metadata"].get("namespace"), sm_values["namespace"])
            if sm_values["namespace"] != release_ns:
                want("ServiceMonitor namespaceSelector", sm["spec"].get("namespaceSelector"), {"matchNames": [release_ns]})
        (endpoint,) = sm["spec"].get("endpoints") or [{}]
        for k in ("scrapeTimeout", "relabelings", "metricRelabelings"):
            if sm_values.get(k):
                want(f"ServiceMonitor endpoint {k}", endpoint.get(k), sm_values[k])
    rule_values = v.get("prometheusRule") or {}
    if rule_values.get("enabled"):
        rule = one("PrometheusRule")
        if rule_values.get("namespace"):
            want("PrometheusRule namespace", rule["metadata"].get("namespace"), rule_values["namespace"])
        if rule_values.get("additionalRules"):
            want("PrometheusRule additional rules", rule["spec"]["groups"][-1]["rules"], rule_values["additionalRules"])
    extra = [o for o in objs if o["metadata"]["name"].endswith(("-extra", "-extra-string"))]
    want("extraObjects rendered", len(extra), len(v.get("extraObjects") or []))
    if bad:
        sys.exit(f"{path}: " + "; ".join(bad))
    print(f"{path}: every chart convention of {values_path} rendered")


# Artifact Hub's Helm annotations (internal/tracker/source/helm: EnrichPackageFromAnnotations).
AH = "artifacthub.io/"
AH_CHANGE_KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}
AH_CAPABILITIES = {"basic install", "seamless upgrades", "full lifecycle", "deep insights", "auto pilot"}
AH_KNOWN = {"alternativeName", "category", "changes", "containsSecurityUpdates", "crds", "crdsExamples",
            "images", "license", "links", "maintainers", "operator", "operatorCapabilities", "prerelease",
            "recommendations", "screenshots", "signKey"}


def chart_annotations(chart_path, rendered, csv_path):
    with open(chart_path) as f:
        chart = yaml.safe_load(f)
    a = chart.get("annotations") or {}
    bad = []

    def yaml_list(key, required):
        try:
            items = yaml.safe_load(a[AH + key])
        except (KeyError, yaml.YAMLError) as e:
            bad.append(f"{AH}{key}: {e!r}")
            return []
        if not isinstance(items, list) or not all(isinstance(i, dict) and all(i.get(r) for r in required) for i in items):
            bad.append(f"{AH}{key}: not a list of objects with {required}")
            return []
        return items

    unknown = {k for k in a if k.startswith(AH) and k[len(AH):] not in AH_KNOWN}
    if unknown:
        bad.append(f"unknown Artifact Hub annotations {sorted(unknown)}")
    for key in ("operator", "prerelease", "containsSecurityUpdates"):
        if a.get(AH + key) not in ("true", "false"):
            bad.append(f"{AH}{key} is {a.get(AH + key)!r}, want the string true or false")
    if a.get(AH + "prerelease") != str("-" in chart["version"]).lower():
        bad.append(f"{AH}prerelease {a.get(AH + 'prerelease')} for version {chart['version']}")
    (csv,) = docs(csv_path)
    capability = a.get(AH + "operatorCapabilities", "")
    if capability.lower() not in AH_CAPABILITIES or capability != csv["metadata"]["annotations"].get("capabilities"):
        bad.append(f"{AH}operatorCapabilities {capability!r}: not the CSV's {csv['metadata']['annotations'].get('capabilities')!r}")
    if a.get(AH + "license") != "Apache-2.0":
        bad.append(f"{AH}license is {a.get(AH + 'license')!r}")
    for change in yaml_list("changes", ["description"]):
        if change.get("kind", "changed") not in AH_CHANGE_KINDS:
            bad.append(f"{AH}changes: kind {change['kind']!r} not one of {sorted(AH_CHANGE_KINDS)}")
    for link in yaml_list("links", ["name", "url"]):
        if not link["url"].startswith("https://"):
            bad.append(f"{AH}links: {link['url']} is not https")
    if not str(chart.get("icon", "")).startswith("https://"):
        bad.append(f"icon {chart.get('icon')!r} is not an https URL")
    objs = docs(rendered)
    # The images Artifact Hub scans are the images the chart runs by default.
    images = sorted(i["image"] for i in yaml_list("images", ["name", "image"]))
    used = sorted({c["image"] for o in objs for _, spec in pod_specs(o) for c in spec["containers"]})
    if images != used:
        bad.append(f"{AH}images {images}, the default render runs {used}")
    crds = sorted((c["kind"], c["version"], c["name"]) for c in yaml_list("crds", ["kind", "version", "name", "description"]))
    served = sorted((o["spec"]["names"]["kind"], ver["name"], o["metadata"]["name"])
                    for o in objs if o["kind"] == "CustomResourceDefinition" for ver in o["spec"]["versions"] if ver.get("storage"))
    if crds != served:
        bad.append(f"{AH}crds {crds}, the chart's CRDs {served}")
    if bad:
        sys.exit(f"{chart_path}: " + "; ".join(bad))
    print(f"{chart_path}: Artifact Hub annotations parse and agree with the chart, its images, CRDs and the CSV")


def uninstall_hook(path, mode="present"):
    """docs/adr/0006: `helm uninstall` releases the At pods' finalizers before the operator goes."""
    objs = docs(path)
    hooks = [o for o in objs if o["kind"] == "Job"
             and "pre-delete" in (o["metadata"].get("annotations") or {}).get("helm.sh/hook", "")]
    if mode == "none":
        if hooks:
            sys.exit(f"{path}: a pre-delete hook was rendered: {[h['metadata']['name'] for h in hooks]}")
        print("uninstall hook: none, as asked")
        return
    if len(hooks) != 1:
        sys.exit(f"{path}: expected one pre-delete hook Job, found {len(hooks)}")
    hook = hooks[0]["spec"]["template"]["spec"]
    operator = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    run, release = operator["containers"][0], hook["containers"][0]
    if release.get("args") != ["release-finalizers"] or release.get("command"):
        sys.exit(f"{path}: the hook runs {release.get('command')} {release.get('args')}, not release-finalizers")
    if release["image"] != run["image"]:
        sys.exit(f"{path}: the hook's image {release['image']} is not the operator's {run['image']}")
    if hook.get("serviceAccountName") != operator.get("serviceAccountName"):
        sys.exit(f"{path}: the hook runs as {hook.get('serviceAccountName')}, the operator as "
                 f"{operator.get('serviceAccountName')} (whose RBAC lists and patches pods)")
    watched = lambda c: [e.get("value") for e in c.get("env") or [] if e["name"] == "WATCH_NAMESPACE"]
    if watched(release) != watched(run):
        sys.exit(f"{path}: the hook releases pods of {watched(release) or 'every namespace'}, "
                 f"the operator watches {watched(run) or 'every namespace'}")
    print(f"uninstall hook: release-finalizers as {hook['serviceAccountName']} over {watched(run) or 'every namespace'}")


def sbom_covers_lock(sbom, lock):
    import tomllib
    with open(sbom) as f:
        bom = json.load(f)
    with open(lock, "rb") as f:
        packages = tomllib.load(f)["package"]
    if bom.get("bomFormat") != "CycloneDX":
        sys.exit(f"{sbom}: not a CycloneDX document")
    listed = {(c.get("name"), c.get("version")) for c in bom.get("components", [])}
    missing = sorted({(p["name"], p["version"]) for p in packages} - listed)
    if missing:
        sys.exit(f"{sbom}: {len(missing)} packages of {lock} missing: "
                 + ", ".join(f"{n} {v}" for n, v in missing[:20]))
    print(f"{sbom}: lists all {len(packages)} packages of {lock}")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"rules-file": rules_file, "dashboard-rules": dashboard_rules, "alm-examples": alm_examples,
     "same-rbac": same_rbac, "no-cluster-rbac": no_cluster_rbac, "user-roles": user_roles,
     "purge-key": purge_key,
     "crd-for-objects": crd_for_objects, "all-in-namespace": all_in_namespace,
     "same-crds": same_crds, "pod-ids": pod_ids, "no-kind": no_kind,
     "catalog-properties": catalog_properties, "released": released,
     "bundle-annotations": bundle_annotations, "olm-monitoring": olm_monitoring,
     "kube-prometheus-stack": kube_prometheus_stack, "pod-monitor-namespace": pod_monitor_namespace,
     "nginx-metrics-image": nginx_metrics_image, "helm-values": helm_values,
     "chart-annotations": chart_annotations, "uninstall-hook": uninstall_hook,
     "sbom-covers-lock": sbom_covers_lock}[cmd](*args)


if __name__ == "__main__":
    main()
