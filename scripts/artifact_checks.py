#!/usr/bin/env python3
"""YAML plumbing for scripts/check-artifacts.sh (the validators themselves are the real tools).

  rules-file PROMETHEUS_RULE.yaml OUT          the PrometheusRule's spec as a Prometheus rules file
  dashboard-rules DASHBOARD.json OUT           every panel query as a recording rule, for promtool
  alm-examples CSV.yaml OUT                    the CSV's alm-examples as a YAML stream
  same-rbac KUSTOMIZE.yaml HELM.yaml           the rendered Helm chart grants exactly the kustomize RBAC
  no-cluster-rbac RENDERED.yaml                single-namespace output has no cluster RBAC but the metrics'
  crd-for-objects CRD.yaml OUT                 the CRD with the root fields every object has
  all-in-namespace NS RENDERED.yaml            every namespaced object and RBAC subject is in NS
  same-crds RENDERED.yaml CRD.yaml...          the rendered CRDs are these (labels, annotations aside)
"""
import json
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


def no_cluster_rbac(path):
    objs = docs(path)
    extra = grants(objs, {"ClusterRole"}) - METRICS_CLUSTER_GRANTS
    if extra:
        sys.exit(f"{path}: single-namespace mode still has cluster RBAC beyond the metrics: {sorted(extra)}")
    roles = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole"}
    bad = [o["metadata"]["name"] for o in objs
           if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] not in roles]
    if bad:
        sys.exit(f"{path}: single-namespace mode binds cluster roles it does not ship: {bad}")
    if not any(o["kind"] == "Role" and o["metadata"]["name"].endswith("cdn-operator") for o in docs(path)):
        sys.exit(f"{path}: no Role for the operator")


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


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"rules-file": rules_file, "dashboard-rules": dashboard_rules, "alm-examples": alm_examples,
     "same-rbac": same_rbac, "no-cluster-rbac": no_cluster_rbac,
     "crd-for-objects": crd_for_objects, "all-in-namespace": all_in_namespace,
     "same-crds": same_crds}[cmd](*args)


if __name__ == "__main__":
    main()
