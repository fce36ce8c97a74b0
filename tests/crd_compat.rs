//! Upgrades keep what users stored: the current CRDs (`cdn-operator crd`) must accept every object
//! the CRDs of each release accepted. The released CRDs are checked-in copies made at release
//! (tests/fixtures/released-crds/VERSION/, scripts/release-crds.sh). Two checks:
//! - a structural comparison of the schemas of every version a release served: nothing a release
//!   accepted is refused now (no property removed, no type changed, no new required field, no enum
//!   value removed, no tighter bound or pattern, no new CEL rule without `oldSelf`), and served
//!   and storage versions kept. It names the path of each difference;
//! - the objects we know (seed examples, CSV alm-examples, examples/, objects captured from a real
//!   API server) validated by the offline validator of ../shared against both: every object a
//!   release accepted is accepted now.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every released copy: (version, its CRDs by metadata.name).
fn released() -> Vec<(String, BTreeMap<String, Value>)> {
    let dir = root().join("tests/fixtures/released-crds");
    let mut releases = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let entry = entry.unwrap();
        let version = entry.file_name().to_string_lossy().into_owned();
        let mut crds = BTreeMap::new();
        for file in std::fs::read_dir(entry.path()).unwrap() {
            let path = file.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let crd: Value =
                serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = crd["metadata"]["name"].as_str().expect("metadata.name");
            crds.insert(name.to_string(), crd);
        }
        assert!(!crds.is_empty(), "{}: no CRDs", entry.path().display());
        releases.push((version, crds));
    }
    // By version number, not by text (0.10.0 after 0.9.0).
    releases.sort_by_key(|(version, _)| {
        version
            .split(['.', '-'])
            .map(|n| n.parse::<u64>().unwrap_or(u64::MAX))
            .collect::<Vec<_>>()
    });
    releases
}

fn current() -> BTreeMap<String, Value> {
    cdn_operator::api::crds()
        .into_iter()
        .map(|crd| {
            let value = serde_json::to_value(&crd).unwrap();
            (
                value["metadata"]["name"].as_str().unwrap().to_string(),
                value,
            )
        })
        .collect()
}

/// Why `new` could refuse an object `old` accepted, one line per difference, each naming the CRD,
/// the version and the path. Empty: every object valid under `old` is valid under `new`.
fn incompatibilities(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let name = old["metadata"]["name"].as_str().unwrap_or("?");
    for field in ["group", "scope"] {
        if old["spec"][field] != new["spec"][field] {
            out.push(format!(
                "{name}: spec.{field} changed from {} to {}",
                old["spec"][field], new["spec"][field]
            ));
        }
    }
    for field in ["kind", "plural", "singular", "listKind"] {
        let (o, n) = (&old["spec"]["names"][field], &new["spec"]["names"][field]);
        if !o.is_null() && o != n {
            out.push(format!(
                "{name}: spec.names.{field} changed from {o} to {n}"
            ));
        }
    }
    let versions = |crd: &Value| -> BTreeMap<String, Value> {
        crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| (v["name"].as_str().unwrap_or("?").to_string(), v.clone()))
            .collect()
    };
    let new_versions = versions(new);
    for (version, old_v) in versions(old) {
        let served = old_v["served"] == Value::Bool(true);
        let storage = old_v["storage"] == Value::Bool(true);
        let Some(new_v) = new_versions.get(&version) else {
            let role = if storage { "storage" } else { "served" };
            out.push(format!(
                "{name}: version {version} ({role} by the release) is gone: objects stored or \
                 written as {version} could not be read"
            ));
            continue;
        };
        if served && new_v["served"] != Value::Bool(true) {
            out.push(format!(
                "{name}: version {version} is no longer served (deprecate it first: ADR 0005)"
            ));
        }
        if served {
            let at = format!("{name} {version}:");
            compare(
                &at,
                "",
                &old_v["schema"]["openAPIV3Schema"],
                &new_v["schema"]["openAPIV3Schema"],
                &mut out,
            );
        }
    }
    out
}

/// The rules of `old` → `new` at one schema node; `path` as `.spec.sources[].weight`.
fn compare(at: &str, path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    let shown = if path.is_empty() { "." } else { path };
    let mut say = |what: String| out.push(format!("{at} {shown}: {what}"));
    let flag = |s: &Value, key: &str| s[key] == Value::Bool(true);

    // Types: int-or-string accepts both; gaining it widens, losing it narrows.
    if flag(old, "x-kubernetes-int-or-string") {
        if !flag(new, "x-kubernetes-int-or-string") {
            say("is no longer int-or-string".into());
        }
    } else if !flag(new, "x-kubernetes-int-or-string") && old["type"] != new["type"] {
        say(format!(
            "type changed from {} to {}",
            old["type"], new["type"]
        ));
    }
    if flag(old, "nullable") && !flag(new, "nullable") {
        say("is no longer nullable: a stored null would be refused".into());
    }
    if flag(old, "x-kubernetes-preserve-unknown-fields")
        && !flag(new, "x-kubernetes-preserve-unknown-fields")
    {
        say("no longer preserves unknown fields: they would be pruned".into());
    }

    // Required fields: a new one refuses every object without it.
    let set =
        |s: &Value, key: &str| -> Vec<Value> { s[key].as_array().cloned().unwrap_or_default() };
    let old_required = set(old, "required");
    for field in set(new, "required") {
        if !old_required.contains(&field) {
            say(format!("new required field {field}"));
        }
    }

    // Enums: a new enum, or a value removed, refuses stored values.
    match (old.get("enum"), new.get("enum")) {
        (None, Some(values)) => say(format!("enum {values} added")),
        (Some(old_values), Some(_)) => {
            let new_values = set(new, "enum");
            for value in old_values.as_array().into_iter().flatten() {
                if !new_values.contains(value) {
                    say(format!("enum value {value} removed"));
                }
            }
        }
        _ => {}
    }

    // Bounds: a lower bound raised or an upper bound lowered (or either added) refuses values.
    for (key, lower) in [
        ("minimum", true),
        ("minLength", true),
        ("minItems", true),
        ("minProperties", true),
        ("maximum", false),
        ("maxLength", false),
        ("maxItems", false),
        ("maxProperties", false),
    ] {
        let (o, n) = (old[key].as_f64(), new[key].as_f64());
        let tighter = match (o, n) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(o), Some(n)) => {
                if lower {
                    n > o
                } else {
                    n < o
                }
            }
        };
        if tighter {
            say(format!("{key} tightened from {} to {}", old[key], new[key]));
        }
    }
    for key in ["exclusiveMinimum", "exclusiveMaximum", "uniqueItems"] {
        if flag(new, key) && !flag(old, key) {
            say(format!("{key} added"));
        }
    }
    // A pattern or format cannot be proven wider than another: any change or addition counts.
    for key in ["pattern", "format"] {
        if !new[key].is_null() && old[key] != new[key] {
            say(format!("{key} changed from {} to {}", old[key], new[key]));
        }
    }
    // Combinators are compared whole, for the same reason.
    for key in ["allOf", "anyOf", "oneOf", "not"] {
        if !new[key].is_null() && old[key] != new[key] {
            say(format!("{key} changed"));
        }
    }
    // A list's type decides what duplicates and merges the server accepts.
    for key in [
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    ] {
        if old[key] != new[key] {
            say(format!("{key} changed from {} to {}", old[key], new[key]));
        }
    }

    // CEL rules: one not in the release can refuse a stored object on its next write, unless it
    // is a transition rule (it reads `oldSelf`, so it only judges changes).
    let old_rules: Vec<&Value> = old["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| &r["rule"])
        .collect();
    for rule in new["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let text = rule["rule"].as_str().unwrap_or("");
        if !old_rules.contains(&&rule["rule"]) && !text.contains("oldSelf") {
            say(format!(
                "new CEL rule `{text}` that objects stored under the release may fail (only \
                 transition rules, with oldSelf, can be added)"
            ));
        }
    }

    // Children.
    if let Some(properties) = old["properties"].as_object() {
        for (field, old_field) in properties {
            let child = format!("{path}.{field}");
            match new["properties"].get(field) {
                Some(new_field) => compare(at, &child, old_field, new_field, out),
                // Without preserve-unknown-fields the server prunes it: stored data lost.
                None => out.push(format!("{at} {child}: property removed")),
            }
        }
    }
    if old["items"].is_object() {
        compare(at, &format!("{path}[]"), &old["items"], &new["items"], out);
    }
    match (&old["additionalProperties"], &new["additionalProperties"]) {
        (o @ Value::Object(_), n @ Value::Object(_)) => {
            compare(at, &format!("{path}.*"), o, n, out)
        }
        (Value::Object(_) | Value::Bool(true), n) if n != &Value::Bool(true) && !n.is_object() => {
            out.push(format!(
                "{at} {shown}: additionalProperties no longer allowed"
            ))
        }
        _ => {}
    }
}

#[test]
fn the_current_crds_accept_everything_each_release_accepted() {
    let releases = released();
    assert!(
        releases.iter().any(|(v, _)| v == "0.1.0"),
        "the first release's CRDs are kept"
    );
    let current = current();
    let mut problems = Vec::new();
    for (version, crds) in &releases {
        for (name, old) in crds {
            match current.get(name) {
                Some(new) => problems.extend(
                    incompatibilities(old, new)
                        .into_iter()
                        .map(|p| format!("since {version}: {p}")),
                ),
                None => problems.push(format!("since {version}: the CRD {name} is gone")),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the current CRDs would refuse objects a release accepted:\n  {}",
        problems.join("\n  ")
    );
}

/// With `conversion: None` the API server only rewrites apiVersion between versions, which is
/// right only while their schemas are the same (docs/adr/0005-at-api-versions.md).
fn conversion_problems(crd: &Value) -> Vec<String> {
    let strategy = crd["spec"]["conversion"]["strategy"]
        .as_str()
        .unwrap_or("None");
    let versions = crd["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if strategy != "None" || versions.is_empty() {
        return Vec::new();
    }
    let first = &versions[0];
    versions[1..]
        .iter()
        .filter(|v| v["schema"] != first["schema"])
        .map(|v| {
            format!(
                "{}: version {} has a schema other than {}'s but no conversion webhook",
                crd["metadata"]["name"], v["name"], first["name"]
            )
        })
        .collect()
}

#[test]
fn versions_converted_without_a_webhook_have_the_same_schema() {
    for crd in current().values() {
        let problems = conversion_problems(crd);
        assert!(problems.is_empty(), "{problems:#?}");
    }
    // Two versions, the same schema: fine; v1 with a field of its own: refused.
    let mut two = crd(serde_json::json!([
        version("v1alpha1", true, true, schema()),
        version("v1", true, false, schema()),
    ]));
    assert!(conversion_problems(&two).is_empty());
    two["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["added"] = serde_json::json!({"type": "string"});
    refused(
        conversion_problems(&two),
        "version \"v1\" has a schema other than \"v1alpha1\"'s but no conversion webhook",
    );
}

// ---- The objects we know, validated against each release and against the current CRDs.

/// The files holding custom resources: the seed examples, examples/, the TLS golden input, the
/// objects captured from a real API server, the Argo CD health checks' test objects, and the
/// CSV's alm-examples (written to `dir`).
fn object_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut add_dir = |d: PathBuf, ext: &[&str]| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| ext.iter().any(|e| x == *e)))
            .collect();
        found.sort();
        files.extend(found);
    };
    add_dir(support::shared("seed-examples"), &["yaml"]);
    add_dir(root().join("examples"), &["yaml"]);
    add_dir(root().join("tests/fixtures/real-server"), &["json"]);
    // The Argo CD health checks' objects: CdnClusters and Ats with every kind of status.
    for group in [
        "cluster.anevia.com/CdnCluster",
        "cnat.programming-kubernetes.info/At",
    ] {
        let testdata = root().join("argocd/health").join(group).join("testdata");
        if testdata.is_dir() {
            add_dir(testdata, &["yaml"]);
        }
    }
    files.push(root().join("tests/golden/tls-topology.yaml"));

    let csv_path = root().join("bundle/manifests/cdn-operator.clusterserviceversion.yaml");
    let csv: Value = serde_yaml::from_str(&std::fs::read_to_string(&csv_path).unwrap()).unwrap();
    let examples: Vec<Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .unwrap(),
    )
    .expect("alm-examples is a JSON array");
    assert!(!examples.is_empty());
    for (i, example) in examples.iter().enumerate() {
        let path = dir.join(format!("alm-example-{i}.json"));
        std::fs::write(&path, serde_json::to_string(example).unwrap()).unwrap();
        files.push(path);
    }
    files
}

/// The validator's verdict on each object of `files` under the CRDs in `crds`, by
/// "file: name": true when accepted, false with the reasons when not.
fn verdicts(crds: &Path, files: &[PathBuf]) -> BTreeMap<String, Result<(), String>> {
    let out = Command::new("python3")
        .arg(support::shared("tools/crd_validate.py"))
        .arg(crds)
        .args(files)
        .output()
        .expect("python3 with jsonschema and pyyaml (scripts/install-test-deps.sh)");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Traceback"),
        "the validator crashed:\n{stderr}"
    );
    let mut verdicts: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    for line in report.lines() {
        // "FILE: NAME: OK" or "FILE: NAME: /PATH: MESSAGE" (FILE has no ": ").
        let mut parts = line.splitn(3, ": ");
        let (Some(file), Some(name), Some(rest)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("unexpected validator line: {line}");
        };
        let key = format!(
            "{}: {name}",
            Path::new(file).file_name().unwrap().to_string_lossy()
        );
        if rest == "OK" {
            verdicts.entry(key).or_insert(Ok(()));
        } else {
            let entry = verdicts.entry(key).or_insert(Ok(()));
            let reasons = match entry {
                Err(r) => format!("{r}; {rest}"),
                Ok(()) => rest.to_string(),
            };
            *entry = Err(reasons);
        }
    }
    verdicts
}

fn write_crds(dir: &Path, name: &str, crds: impl IntoIterator<Item = Value>) -> PathBuf {
    let path = dir.join(name);
    let docs: Vec<String> = crds
        .into_iter()
        .map(|c| serde_yaml::to_string(&c).unwrap())
        .collect();
    std::fs::write(&path, docs.join("---\n")).unwrap();
    path
}

#[test]
fn every_known_object_a_release_accepted_is_accepted_now() {
    let dir = tempfile::tempdir().unwrap();
    let files = object_files(dir.path());
    let now = verdicts(
        &write_crds(dir.path(), "current.yaml", current().into_values()),
        &files,
    );
    for (version, crds) in released() {
        let then = verdicts(
            &write_crds(dir.path(), &format!("{version}.yaml"), crds.into_values()),
            &files,
        );
        // 41 objects for 0.1.0 (seed examples, examples/, real-server captures, Argo CD test
        // objects, alm-examples): a handful would mean files were not read.
        let accepted: Vec<&String> = then
            .iter()
            .filter(|(_, v)| v.is_ok())
            .map(|(k, _)| k)
            .collect();
        assert!(
            accepted.len() >= 30,
            "{version}: only {} objects accepted: {then:#?}",
            accepted.len()
        );
        eprintln!(
            "{version}: {} of {} objects accepted, each checked now",
            accepted.len(),
            then.len()
        );
        for key in accepted {
            match now.get(key) {
                Some(Ok(())) => {}
                Some(Err(reasons)) => {
                    panic!("{key}: accepted by the CRDs of {version}, refused now: {reasons}")
                }
                None => panic!("{key}: accepted by the CRDs of {version}, not checked now"),
            }
        }
    }
}

// ---- The comparator on small schemas: each rule refuses the change it names, and lets wider
// changes through.

fn crd(versions: Value) -> Value {
    serde_json::json!({
        "metadata": {"name": "things.example.com"},
        "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Thing", "plural": "things"},
            "versions": versions,
        }
    })
}

fn schema() -> Value {
    serde_json::json!({
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name.size() <= 63"}],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string", "enum": ["a", "b"]},
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "nullable": true},
                    "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z]+$"},
                    "port": {"x-kubernetes-int-or-string": true},
                    "sources": {
                        "type": "array", "maxItems": 5,
                        "items": {"type": "object", "properties": {"weight": {"type": "integer"}}},
                    },
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }
            }
        }
    })
}

fn version(name: &str, served: bool, storage: bool, schema: Value) -> Value {
    serde_json::json!({"name": name, "served": served, "storage": storage,
        "schema": {"openAPIV3Schema": schema}})
}

/// The problems found when `mutate` is applied to the schema of a one-version CRD.
fn after(mutate: impl FnOnce(&mut Value)) -> Vec<String> {
    let old = crd(serde_json::json!([version("v1", true, true, schema())]));
    let mut new = old.clone();
    mutate(&mut new["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
    incompatibilities(&old, &new)
}

fn refused(problems: Vec<String>, expected: &str) {
    assert!(
        problems.len() == 1 && problems[0].contains(expected),
        "expected one problem with {expected:?}, got {problems:#?}"
    );
}

/// A change made to the schema of a test CRD.
type Mutation = Box<dyn FnOnce(&mut Value)>;

#[test]
fn the_comparator_refuses_each_narrowing_and_names_its_path() {
    let cases: Vec<(Mutation, &str)> = vec![
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]
                    .as_object_mut()
                    .unwrap()
                    .remove("name");
            }),
            "things.example.com v1: .spec.name: property removed",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["replicas"]["type"] = "string".into()
            }),
            ".spec.replicas: type changed from \"integer\" to \"string\"",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["required"] = serde_json::json!(["role", "name"])),
            ".spec: new required field \"name\"",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["role"]["enum"] = serde_json::json!(["a"])
            }),
            ".spec.role: enum value \"b\" removed",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["name"]["enum"] = serde_json::json!(["x"])
            }),
            ".spec.name: enum [\"x\"] added",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["replicas"]["minimum"] = 1.into()),
            ".spec.replicas: minimum tightened from 0 to 1",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["replicas"]["maximum"] = 9.into()),
            ".spec.replicas: maximum tightened from 10 to 9",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["name"]["maxLength"] = 52.into()),
            ".spec.name: maxLength tightened from 63 to 52",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["name"]["minLength"] = 1.into()),
            ".spec.name: minLength tightened from null to 1",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["name"]["pattern"] = "^[a-y]+$".into()
            }),
            ".spec.name: pattern changed",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["sources"]["maxItems"] = 4.into()),
            ".spec.sources: maxItems tightened from 5 to 4",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["sources"]["items"]["properties"]["weight"]
                    ["maximum"] = 100.into()
            }),
            ".spec.sources[].weight: maximum tightened from null to 100",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["replicas"]["nullable"] = false.into()
            }),
            ".spec.replicas: is no longer nullable",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["port"] =
                    serde_json::json!({"type": "integer"})
            }),
            ".spec.port: is no longer int-or-string",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["labels"]["additionalProperties"]
                    ["maxLength"] = 10.into()
            }),
            ".spec.labels.*: maxLength tightened",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["sources"]["x-kubernetes-list-type"] =
                    "set".into()
            }),
            ".spec.sources: x-kubernetes-list-type changed from null to \"set\"",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["x-kubernetes-validations"] =
                    serde_json::json!([{"rule": "self.role != 'b'"}])
            }),
            ".spec: new CEL rule `self.role != 'b'`",
        ),
        (
            Box::new(|s| {
                s["x-kubernetes-validations"] =
                    serde_json::json!([{"rule": "self.metadata.name.size() <= 52"}])
            }),
            "things.example.com v1: .: new CEL rule `self.metadata.name.size() <= 52`",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["name"]["format"] = "uuid".into()),
            ".spec.name: format changed from null to \"uuid\"",
        ),
        (
            Box::new(|s| s["properties"]["spec"]["properties"]["sources"]["minItems"] = 1.into()),
            ".spec.sources: minItems tightened",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["sources"]["uniqueItems"] = true.into()
            }),
            ".spec.sources: uniqueItems added",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove("additionalProperties");
            }),
            ".spec.labels: additionalProperties no longer allowed",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["port"]["anyOf"] =
                    serde_json::json!([{"type": "integer"}])
            }),
            ".spec.port: anyOf changed",
        ),
        (
            Box::new(|s| {
                s["properties"]["spec"]["properties"]["extra"]
                    .as_object_mut()
                    .unwrap()
                    .remove("x-kubernetes-preserve-unknown-fields");
            }),
            ".spec.extra: no longer preserves unknown fields",
        ),
    ];
    for (mutate, expected) in cases {
        refused(after(mutate), expected);
    }
}

#[test]
fn the_comparator_refuses_versions_dropped_or_no_longer_served_and_renames() {
    let old = crd(serde_json::json!([
        version("v1alpha1", true, true, schema()),
        version("v1", true, false, schema()),
    ]));
    let mut gone = old.clone();
    gone["spec"]["versions"].as_array_mut().unwrap().remove(0);
    refused(
        incompatibilities(&old, &gone),
        "version v1alpha1 (storage by the release) is gone",
    );
    let mut unserved = old.clone();
    unserved["spec"]["versions"][1]["served"] = false.into();
    refused(
        incompatibilities(&old, &unserved),
        "version v1 is no longer served",
    );
    let mut renamed = old.clone();
    renamed["spec"]["names"]["plural"] = "thingies".into();
    refused(
        incompatibilities(&old, &renamed),
        "spec.names.plural changed",
    );
    let mut scoped = old.clone();
    scoped["spec"]["scope"] = "Cluster".into();
    refused(incompatibilities(&old, &scoped), "spec.scope changed");
}

#[test]
fn the_comparator_lets_wider_changes_through() {
    let old = crd(serde_json::json!([version(
        "v1alpha1",
        true,
        true,
        schema()
    )]));
    let mut new = old.clone();
    {
        let s = &mut new["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let spec = &mut s["properties"]["spec"];
        spec["properties"]["added"] = serde_json::json!({"type": "string", "maxLength": 3});
        spec["required"] = serde_json::json!([]);
        spec["properties"]["role"]["enum"] = serde_json::json!(["a", "b", "c"]);
        spec["properties"]["role"]["description"] = "documented now".into();
        spec["properties"]["replicas"]["maximum"] = 20.into();
        spec["properties"]["name"]["maxLength"] = 253.into();
        spec["properties"]["sources"]
            .as_object_mut()
            .unwrap()
            .remove("maxItems");
        spec["x-kubernetes-validations"] =
            serde_json::json!([{"rule": "self.role == oldSelf.role", "message": "immutable"}]);
    }
    // A newer version served beside the stored one, the release's storage version kept.
    let mut v1 = new["spec"]["versions"][0].clone();
    v1["name"] = "v1".into();
    new["spec"]["versions"][0]["storage"] = false.into();
    new["spec"]["versions"].as_array_mut().unwrap().push(v1);
    let problems = incompatibilities(&old, &new);
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---- The release step.

/// `scripts/release-crds.sh`, run in a copy of the parts of the repository it reads: it freezes
/// the shipped CRDs under the version given (or Cargo.toml's), never overwrites a released copy,
/// and refuses a version that is not MAJOR.MINOR.PATCH, each with its reason.
#[test]
fn the_release_step_freezes_the_shipped_crds_once() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path();
    std::fs::create_dir_all(tree.join("scripts")).unwrap();
    std::fs::create_dir_all(tree.join("kustomize/base/crds")).unwrap();
    std::fs::copy(
        root().join("scripts/release-crds.sh"),
        tree.join("scripts/release-crds.sh"),
    )
    .unwrap();
    std::fs::write(
        tree.join("Cargo.toml"),
        "[package]\nname = \"x\"\nversion = \"9.8.7\"\n",
    )
    .unwrap();
    let shipped = root().join("kustomize/base/crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        std::fs::copy(&path, tree.join("kustomize/base/crds").join(&name)).unwrap();
        names.push(name);
    }
    let run = |args: &[&str]| {
        let out = Command::new("bash")
            .arg(tree.join("scripts/release-crds.sh"))
            .args(args)
            .output()
            .expect("bash");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    assert_eq!(run(&[]).0, Some(0), "the version of Cargo.toml");
    assert_eq!(run(&["1.2.3-rc.1"]).0, Some(0));
    for version in ["9.8.7", "1.2.3-rc.1"] {
        for name in &names {
            let frozen = tree
                .join("tests/fixtures/released-crds")
                .join(version)
                .join(name);
            assert_eq!(
                std::fs::read(&frozen).unwrap_or_default(),
                std::fs::read(shipped.join(name)).unwrap(),
                "{}",
                frozen.display()
            );
        }
    }
    let (code, stderr) = run(&["9.8.7"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("exists already"), "{stderr}");
    let (code, stderr) = run(&["v2"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("'v2' is not a semantic version"),
        "{stderr}"
    );
}
