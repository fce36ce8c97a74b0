//! The CRDs printed by `cdn-operator crd`, checked by the offline validator of ../shared against
//! the seed examples (accepted unchanged) and bad input (refused, with the reason).

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn validator() -> PathBuf {
    support::shared("tools/crd_validate.py")
}

/// Writes each CRD `cdn-operator crd` prints (the real binary) to its own file.
fn crd_files(dir: &Path) -> Vec<PathBuf> {
    let out = Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
        .arg("crd")
        .output()
        .expect("run cdn-operator crd");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text,
        cdn_operator::api::crds_yaml(),
        "the binary prints the library's CRDs"
    );
    text.split("\n---\n")
        .enumerate()
        .map(|(i, doc)| {
            let path = dir.join(format!("crd-{i}.yaml"));
            std::fs::write(&path, doc).unwrap();
            path
        })
        .collect()
}

/// Runs the validator; returns (accepted, its report).
fn validate(crd: &Path, objects: &[PathBuf]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(validator())
        .arg(crd)
        .args(objects)
        .output()
        .expect("python3 with jsonschema and pyyaml (scripts/install-test-deps.sh)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !report.contains("Traceback"),
        "the validator crashed:\n{report}"
    );
    (out.status.success(), report)
}

fn seed(name: &str) -> PathBuf {
    support::shared("seed-examples").join(name)
}

#[test]
fn the_seed_examples_and_the_readme_topology_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let crds = crd_files(dir.path());
    assert_eq!(crds.len(), 3);
    let clusters = vec![
        seed("cdncluster-balancer.yaml"),
        seed("cdncluster-cache-live.yaml"),
        seed("cdncluster-cache-vod.yaml"),
        root().join("examples/topology.yaml"),
        root().join("examples/pool.yaml"),
        root().join("examples/demo.yaml"),
        root().join("tests/golden/tls-topology.yaml"),
    ];
    let (ok, report) = validate(&crds[0], &clusters);
    assert!(ok, "{report}");
    assert_eq!(report.matches(": OK").count(), 14, "{report}");
    let (ok, report) = validate(&crds[1], &[seed("at-example.yaml")]);
    assert!(ok, "{report}");
    assert!(report.contains("example-at: OK"), "{report}");
    let (ok, report) = validate(&crds[2], &[root().join("examples/purge.yaml")]);
    assert!(ok, "{report}");
    assert_eq!(report.matches(": OK").count(), 3, "{report}");
}

#[test]
fn bad_input_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let crds = crd_files(dir.path());
    let long_secret_name = format!(
        "role: balancer\n  sources: []\n  tls: {{secretName: {}}}",
        "a".repeat(254)
    );
    let cases = [
        (
            "bad-role",
            "role: origin\n  sources: []",
            "'origin' is not one of ['balancer', 'cache']",
        ),
        (
            "null-sources",
            "role: cache\n  sources: null",
            "None is not of type 'array'",
        ),
        (
            "no-sources",
            "role: cache",
            "'sources' is a required property",
        ),
        ("no-role", "sources: []", "'role' is a required property"),
        (
            "nameless-source",
            "role: cache\n  sources:\n  - pathCondition: ^/x",
            "'name' is a required property",
        ),
        (
            "misspelled-field",
            "role: cache\n  sources:\n  - name: a\n    pathcondition: ^/x",
            "'pathcondition' was unexpected",
        ),
        (
            "negative-replicas",
            "role: cache\n  sources: []\n  replicas: -1",
            "-1 is less than the minimum of 0",
        ),
        (
            "zero-weight",
            "role: balancer\n  sources:\n  - name: a\n    weight: 0",
            "0 is less than the minimum of 1",
        ),
        (
            "huge-weight",
            "role: balancer\n  sources:\n  - name: a\n    weight: 101",
            "101 is greater than the maximum of 100",
        ),
        (
            "bad-cache-size",
            "role: cache\n  sources: []\n  cache:\n    size: lots",
            "'lots' does not match",
        ),
        (
            "tls-without-secret",
            "role: balancer\n  sources: []\n  tls: {redirect: true}",
            "'secretName' is a required property",
        ),
        (
            "tls-bad-secret-name",
            "role: balancer\n  sources: []\n  tls: {secretName: Edge_TLS}",
            "'Edge_TLS' does not match",
        ),
        (
            "tls-empty-secret-name",
            "role: balancer\n  sources: []\n  tls: {secretName: ''}",
            "should be non-empty",
        ),
        (
            "tls-long-secret-name",
            long_secret_name.as_str(),
            "is too long",
        ),
        (
            "tls-redirect-not-a-bool",
            "role: balancer\n  sources: []\n  tls: {secretName: edge-tls, redirect: sometimes}",
            "'sometimes' is not of type 'boolean'",
        ),
    ];
    for (name, spec, reason) in cases {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!("apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata:\n  name: {name}\nspec:\n  {spec}\n"),
        )
        .unwrap();
        let (ok, report) = validate(&crds[0], &[path]);
        assert!(!ok, "{name} was accepted:\n{report}");
        assert!(
            report.contains(reason),
            "{name}: expected {reason:?} in:\n{report}"
        );
    }
}

#[test]
fn the_crds_carry_what_kubectl_shows() {
    let crds = cdn_operator::api::crds();
    let cdn = &crds[0];
    assert_eq!(
        cdn.metadata.name.as_deref(),
        Some("cdnclusters.cluster.anevia.com")
    );
    assert_eq!(
        cdn.spec.names.short_names.as_deref(),
        Some(&["cdn".to_string()][..])
    );
    let v1 = &cdn.spec.versions[0];
    assert!(v1.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<_> = v1
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Role", "State", "Ready", "Reason", "Age"]);
    let reason = &v1.additional_printer_columns.as_ref().unwrap()[3];
    assert_eq!(
        reason.json_path, ".status.conditions[?(@.type==\"Ready\")].reason",
        "why it is not ready: the Ready condition's reason"
    );
    let rules = v1
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap()
        .x_kubernetes_validations
        .as_ref()
        .unwrap();
    assert!(rules[0].rule.contains("size() <= 52"));

    let at = &crds[1];
    assert_eq!(
        at.metadata.name.as_deref(),
        Some("ats.cnat.programming-kubernetes.info")
    );
    let columns: Vec<_> = at.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Schedule", "Phase", "Outcome", "Age"]);

    // Every field is described, so `kubectl explain` reads well.
    for crd in &crds {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut missing = Vec::new();
        undocumented(
            &schema["openAPIV3Schema"]["properties"]["spec"],
            "spec",
            &mut missing,
        );
        undocumented(
            &schema["openAPIV3Schema"]["properties"]["status"],
            "status",
            &mut missing,
        );
        assert!(
            missing.is_empty(),
            "{}: fields without a description: {missing:?}",
            crd.spec.names.kind
        );
    }
}

fn undocumented(schema: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
    if schema.get("description").is_none() {
        missing.push(path.to_string());
    }
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, sub) in props {
            undocumented(sub, &format!("{path}.{name}"), missing);
        }
    }
    if let Some(items) = schema.get("items") {
        if items.get("properties").is_some() {
            undocumented(items, &format!("{path}[]"), missing);
        }
    }
}
