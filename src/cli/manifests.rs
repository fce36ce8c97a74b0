//! The manifests `render` and `graph` read: files, directories and stdin, multi-document YAML
//! or JSON, `kind: List` included. CdnClusters and Ats are kept; other kinds are skipped with a
//! note, as they are none of the operator's business.

use crate::api::{At, CdnCluster};
use kube::{Resource, ResourceExt};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The namespace of objects whose manifest names none, when `--namespace` is not given. The
/// kubeconfig is never read for it: offline commands give the same output on every machine.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The objects of the manifests, in the order read, each with its namespace set.
#[derive(Debug, Default)]
pub struct Manifests {
    pub clusters: Vec<CdnCluster>,
    pub ats: Vec<At>,
    /// Objects of other kinds that were skipped, one line each, for stderr.
    pub notes: Vec<String>,
}

impl Manifests {
    /// Reads every `-f` argument: a file, a directory (its `.yaml`, `.yml` and `.json` files, in
    /// name order, not recursively, as `kubectl -f` does), or `-` for `stdin`.
    pub fn read(
        paths: &[PathBuf],
        namespace: Option<&str>,
        stdin: impl Read,
    ) -> Result<Manifests, String> {
        let mut stdin = Some(stdin);
        let mut manifests = Manifests::default();
        for path in paths {
            if path.as_os_str() == "-" {
                let mut text = String::new();
                stdin
                    .take()
                    .ok_or("stdin (-) is given twice")?
                    .read_to_string(&mut text)
                    .map_err(|e| format!("cannot read stdin: {e}"))?;
                manifests.add("stdin", &text, namespace)?;
                continue;
            }
            for file in files(path)? {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
                manifests.add(&file.display().to_string(), &text, namespace)?;
            }
        }
        manifests.check_unique()?;
        Ok(manifests)
    }

    /// Adds the objects of one YAML stream, read from `origin`.
    pub fn add(&mut self, origin: &str, text: &str, namespace: Option<&str>) -> Result<(), String> {
        for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(document)
                .map_err(|e| format!("{origin}: document {}: {e}", i + 1))?;
            let items = match value {
                Value::Null => Vec::new(),
                Value::Object(ref o) if o.get("kind") == Some(&Value::from("List")) => {
                    match o.get("items") {
                        Some(Value::Array(items)) => items.clone(),
                        _ => Vec::new(),
                    }
                }
                other => vec![other],
            };
            for item in items {
                self.add_object(item, namespace)
                    .map_err(|e| format!("{origin}: document {}: {e}", i + 1))?;
            }
        }
        Ok(())
    }

    fn add_object(&mut self, value: Value, namespace: Option<&str>) -> Result<(), String> {
        let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind) = (field("apiVersion").to_string(), field("kind").to_string());
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if (api_version.as_str(), kind.as_str())
            == (&*CdnCluster::api_version(&()), &*CdnCluster::kind(&()))
        {
            let mut cluster: CdnCluster = serde_json::from_value(value)
                .map_err(|e| format!("CdnCluster {name:?} is not valid: {e}"))?;
            set_namespace(&mut cluster, namespace)?;
            self.clusters.push(cluster);
        } else if (api_version.as_str(), kind.as_str()) == (&*At::api_version(&()), &*At::kind(&()))
        {
            let mut at: At = serde_json::from_value(value)
                .map_err(|e| format!("At {name:?} is not valid: {e}"))?;
            set_namespace(&mut at, namespace)?;
            self.ats.push(at);
        } else {
            let what = match (kind.is_empty(), api_version.is_empty()) {
                (true, _) => "an object without kind".to_string(),
                (false, true) => format!("{kind} {name}"),
                (false, false) => format!("{kind} {name} ({api_version})"),
            };
            self.notes
                .push(format!("skipped {what}: neither a CdnCluster nor an At"));
        }
        Ok(())
    }

    /// Two manifests of one object: which one the cluster would hold depends on the order of
    /// apply, so neither is guessed.
    fn check_unique(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        let keys = self
            .clusters
            .iter()
            .map(|c| ("CdnCluster", c.namespace(), c.name_any()))
            .chain(self.ats.iter().map(|a| ("At", a.namespace(), a.name_any())));
        for (kind, namespace, name) in keys {
            let namespace = namespace.unwrap_or_default();
            if !seen.insert((kind, namespace.clone(), name.clone())) {
                return Err(format!("{kind} {namespace}/{name} is given twice"));
            }
        }
        Ok(())
    }
}

/// The namespace an object gets: its manifest's, else `namespace`, else `default`. A manifest
/// naming another namespace than `--namespace` is refused, as `kubectl apply` refuses it.
fn set_namespace<K: Resource>(object: &mut K, namespace: Option<&str>) -> Result<(), String> {
    let meta = object.meta_mut();
    match (meta.namespace.as_deref(), namespace) {
        (Some(own), Some(given)) if own != given => Err(format!(
            "{} is in namespace {own}, not in the namespace {given} given by --namespace",
            meta.name.as_deref().unwrap_or_default()
        )),
        (Some(_), _) => Ok(()),
        (None, given) => {
            meta.namespace = Some(given.unwrap_or(DEFAULT_NAMESPACE).to_string());
            Ok(())
        }
    }
}

fn files(path: &Path) -> Result<Vec<PathBuf>, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let file = entry
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .path();
        let manifest = file
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if manifest && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// The CdnClusters by namespace and name, as the controller's store answers a source lookup.
pub struct Index {
    by_key: HashMap<(String, String), Arc<CdnCluster>>,
}

impl Index {
    pub fn new(clusters: &[CdnCluster]) -> Index {
        let by_key = clusters
            .iter()
            .map(|c| {
                let key = (c.namespace().unwrap_or_default(), c.name_any());
                (key, Arc::new(c.clone()))
            })
            .collect();
        Index { by_key }
    }

    /// The CdnCluster `name` of `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<CdnCluster>> {
        self.by_key
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The lookup `sources::resolve` takes for a cluster of `namespace`.
    pub fn lookup<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Fn(&str) -> Option<Arc<CdnCluster>> + 'a {
        move |name| self.get(namespace, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {name: a}\nspec: {role: cache, sources: []}\n---\n# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: cnat.programming-kubernetes.info/v1alpha1\nkind: At\nmetadata: {name: t, namespace: jobs}\nspec: {schedule: '2019-04-12T10:12:00Z', command: 'true'}\n";

    #[test]
    fn kinds_are_sorted_out_and_namespaces_defaulted() {
        let mut m = Manifests::default();
        m.add("x.yaml", TWO, None).unwrap();
        assert_eq!(m.clusters.len(), 1);
        assert_eq!(m.clusters[0].namespace().as_deref(), Some("default"));
        assert_eq!(m.ats[0].namespace().as_deref(), Some("jobs"));
        assert_eq!(
            m.notes,
            ["skipped ConfigMap c (v1): neither a CdnCluster nor an At"]
        );
    }

    #[test]
    fn the_namespace_flag_fills_in_and_must_agree() {
        let mut m = Manifests::default();
        let error = m.add("x.yaml", TWO, Some("web")).unwrap_err();
        assert_eq!(
            error,
            "x.yaml: document 4: t is in namespace jobs, not in the namespace web given by --namespace"
        );
        assert_eq!(m.clusters[0].namespace().as_deref(), Some("web"));
    }

    #[test]
    fn lists_are_flattened_and_duplicates_refused() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
             "metadata": {"name": "a", "namespace": "default"},
             "spec": {"role": "cache", "sources": []}}]});
        let mut m = Manifests::default();
        m.add("dump.json", &list.to_string(), None).unwrap();
        m.add("x.yaml", TWO, None).unwrap();
        assert_eq!(m.clusters.len(), 2);
        assert_eq!(
            m.check_unique().unwrap_err(),
            "CdnCluster default/a is given twice"
        );
    }

    #[test]
    fn a_bad_spec_names_the_object_and_the_document() {
        let bad = "apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {name: a}\nspec: {role: proxy, sources: []}\n";
        let error = Manifests::default().add("bad.yaml", bad, None).unwrap_err();
        assert!(
            error.starts_with("bad.yaml: document 1: CdnCluster \"a\" is not valid: "),
            "{error}"
        );
    }
}
