//! `cdn-operator graph`: the topology of the CDN, balancers → caches → origins, with each
//! cluster's state, from the cluster or from manifests; as a text tree, Graphviz DOT or Mermaid.
//! Missing sources and cycles are found by the controller's own `sources` step and shown.

use super::manifests::{Index, Manifests};
use crate::api::{CdnCluster, Role};
use crate::cdncluster::sources;
use crate::cdncluster::status::{self, Observed};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Without -f, lists the CdnClusters of the cluster of --kubeconfig (or the in-cluster config) and shows
the state and ready replicas their status records. With -f, reads manifests only (no cluster is
contacted) and shows, for objects without a status, the state the operator's first reconcile would
give them: WaitingSource, Invalid, or Deploying 0/N.

Missing sources are drawn as their own marked nodes, and an edge that closes a cycle of sources is
marked; origins (URL or Service) are the leaves.

Exit status: 0 shown (a broken topology is shown, not an error); 1 unreadable input or the cluster
could not be listed; 2 usage error.")]
pub struct Args {
    /// Manifests instead of the cluster: files, directories (their .yaml, .yml and .json files),
    /// or - for stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE", num_args = 1..)]
    pub files: Vec<PathBuf>,

    /// Namespace to show: from the cluster, default the kubeconfig's; with -f, the namespace of
    /// the objects whose manifest names none (default: default).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,

    /// Every namespace of the cluster.
    #[arg(short = 'A', long, conflicts_with_all = ["namespace", "files"])]
    pub all_namespaces: bool,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,

    #[command(flatten)]
    pub kubeconfig: crate::kubernetes::client::Kubeconfig,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A tree per namespace, for a terminal.
    Text,
    /// Graphviz DOT (`dot -Tsvg`).
    Dot,
    /// A Mermaid flowchart (renders in GitHub and GitLab markdown).
    Mermaid,
}

/// The CdnClusters of some namespaces and what they fetch from.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// By namespace name, each with its clusters in name order.
    pub namespaces: BTreeMap<String, Vec<Node>>,
}

/// A CdnCluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub role: Role,
    /// `Running 2/2`, `WaitingSource`, `no status`.
    pub state: String,
    /// Why it is not deployed or failed (its Ready condition's message), for such states.
    pub message: Option<String>,
    pub sources: Vec<Edge>,
}

/// A source of a CdnCluster, in spec order.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    /// The source's name in the spec.
    pub name: String,
    pub path_condition: Option<String>,
    pub target: Target,
    /// The edge is part of a cycle of CdnCluster sources.
    pub cycle: bool,
    /// How many sources share its pathCondition (its pool; 1 alone) and its weight there.
    pub pool_size: usize,
    pub weight: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A CdnCluster of the namespace.
    Cluster(String),
    /// A CdnCluster that does not exist.
    Missing(String),
    Url(String),
    Service {
        name: String,
        port: i32,
    },
}

impl Topology {
    /// The topology of `clusters`. A cluster without a status shows the state of the operator's
    /// first reconcile when `plan` is set (manifests), else `no status` (a cluster not
    /// reconciled yet).
    pub fn of(clusters: &[CdnCluster], plan: bool) -> Topology {
        let index = Index::new(clusters);
        let mut namespaces: BTreeMap<String, Vec<Node>> = BTreeMap::new();
        for cluster in clusters {
            let namespace = cluster.namespace().unwrap_or_default();
            let lookup = index.lookup(&namespace);
            let cycle: HashSet<(String, String)> = sources::find_cycle(cluster, &lookup)
                .map(|path| {
                    path.windows(2)
                        .map(|w| (w[0].clone(), w[1].clone()))
                        .collect()
                })
                .unwrap_or_default();
            let name = cluster.name_any();
            let sources = cluster
                .spec
                .sources
                .iter()
                .map(|source| {
                    let target = match &source.origin {
                        Some(origin) => match (&origin.url, &origin.service) {
                            (_, Some(service)) => Target::Service {
                                name: service.name.clone(),
                                port: service.port,
                            },
                            (url, None) => Target::Url(url.clone().unwrap_or_default()),
                        },
                        None if lookup(&source.name).is_some() => {
                            Target::Cluster(source.name.clone())
                        }
                        None => Target::Missing(source.name.clone()),
                    };
                    Edge {
                        name: source.name.clone(),
                        path_condition: source.path_condition.clone(),
                        cycle: source.origin.is_none()
                            && cycle.contains(&(name.clone(), source.name.clone())),
                        pool_size: cluster
                            .spec
                            .sources
                            .iter()
                            .filter(|s| s.path_condition == source.path_condition)
                            .count(),
                        weight: source.weight(),
                        target,
                    }
                })
                .collect();
            let (state, message) = state(cluster, &lookup, plan);
            namespaces.entry(namespace.clone()).or_default().push(Node {
                name,
                role: cluster.spec.role,
                state,
                message,
                sources,
            });
        }
        for nodes in namespaces.values_mut() {
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Topology { namespaces }
    }

    /// A tree per namespace, from the clusters no other cluster fetches from; a cluster met
    /// again is not expanded again, and an edge back into the current path is marked as the
    /// cycle it closes.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (namespace, nodes) in &self.namespaces {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = writeln!(out, "namespace {namespace}");
            let mut shown = HashSet::new();
            for root in roots(nodes) {
                if shown.contains(&root.name) {
                    continue;
                }
                out.push('\n');
                let _ = writeln!(out, "{}", describe(root));
                shown.insert(root.name.clone());
                let mut path = vec![root.name.clone()];
                tree(nodes, root, "", &mut path, &mut shown, &mut out);
            }
        }
        out
    }

    /// Graphviz DOT: a box per cluster inside a frame per namespace, origins as ellipses,
    /// missing sources dashed red, cycle edges red.
    pub fn dot(&self) -> String {
        let mut out = String::from(
            "digraph cdn {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\"];\n",
        );
        let mut edges = String::new();
        for (n, (namespace, nodes)) in self.namespaces.iter().enumerate() {
            let _ = writeln!(
                out,
                "  subgraph cluster_{n} {{\n    label=\"{}\";",
                dot_escape(&format!("namespace {namespace}"))
            );
            let id = |kind: &str, key: &str| dot_escape(&format!("{namespace}/{kind}/{key}"));
            for node in nodes {
                let _ = writeln!(
                    out,
                    "    \"{}\" [label=\"{}\"];",
                    id("cdn", &node.name),
                    dot_escape(&format!(
                        "{}\n{} · {}",
                        node.name,
                        node.role.as_str(),
                        node.state
                    ))
                );
            }
            for target in leaves(nodes) {
                let (key, attributes) = match &target {
                    Target::Missing(name) => (
                        id("missing", name),
                        format!(
                            "style=\"dashed,bold\", color=red, fontcolor=red, label=\"{}\"",
                            dot_escape(&format!("{name}\nmissing CdnCluster"))
                        ),
                    ),
                    other => (
                        id("origin", &leaf_key(other)),
                        format!("shape=ellipse, label=\"{}\"", dot_escape(&origin(other))),
                    ),
                };
                let _ = writeln!(out, "    \"{key}\" [{attributes}];");
            }
            out.push_str("  }\n");
            for node in nodes {
                for edge in &node.sources {
                    let to = match &edge.target {
                        Target::Cluster(name) => id("cdn", name),
                        Target::Missing(name) => id("missing", name),
                        other => id("origin", &leaf_key(other)),
                    };
                    let mut attributes = format!("label=\"{}\"", dot_escape(&edge_label(edge)));
                    if edge.cycle {
                        attributes.push_str(", color=red, fontcolor=red, penwidth=2");
                    }
                    let _ = writeln!(
                        edges,
                        "  \"{}\" -> \"{to}\" [{attributes}];",
                        id("cdn", &node.name)
                    );
                }
            }
        }
        out.push_str(&edges);
        out.push_str("}\n");
        out
    }

    /// A Mermaid flowchart: a subgraph per namespace, origins as stadiums, missing sources
    /// dashed red, cycle edges red.
    pub fn mermaid(&self) -> String {
        let mut out = String::from("flowchart LR\n");
        let mut edges = String::new();
        let mut cycle_edges = Vec::new();
        let mut edge_count = 0;
        let mut missing_ids = Vec::new();
        for (n, (namespace, nodes)) in self.namespaces.iter().enumerate() {
            let id = |kind: &str, i: usize| format!("{kind}{n}_{i}");
            let cluster_id = |name: &str| {
                let i = nodes.iter().position(|c| c.name == name).unwrap_or(0);
                id("c", i)
            };
            let leaves = leaves(nodes);
            let leaf_id = |target: &Target| {
                let i = leaves.iter().position(|t| t == target).unwrap_or(0);
                id("o", i)
            };
            let _ = writeln!(
                out,
                "  subgraph ns{n}[\"{}\"]",
                mermaid_escape(&format!("namespace {namespace}"))
            );
            for (i, node) in nodes.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "    {}[\"{}<br/>{} · {}\"]",
                    id("c", i),
                    mermaid_escape(&node.name),
                    node.role.as_str(),
                    mermaid_escape(&node.state)
                );
            }
            for target in &leaves {
                let shape = match target {
                    Target::Missing(name) => {
                        missing_ids.push(leaf_id(target));
                        format!("[\"{}<br/>missing CdnCluster\"]", mermaid_escape(name))
                    }
                    other => format!("([\"{}\"])", mermaid_escape(&origin(other))),
                };
                let _ = writeln!(out, "    {}{shape}", leaf_id(target));
            }
            out.push_str("  end\n");
            for node in nodes {
                for edge in &node.sources {
                    let to = match &edge.target {
                        Target::Cluster(name) => cluster_id(name),
                        other => leaf_id(other),
                    };
                    let _ = writeln!(
                        edges,
                        "  {} -->|\"{}\"| {to}",
                        cluster_id(&node.name),
                        mermaid_escape(&edge_label(edge))
                    );
                    if edge.cycle {
                        cycle_edges.push(edge_count.to_string());
                    }
                    edge_count += 1;
                }
            }
        }
        out.push_str(&edges);
        if !missing_ids.is_empty() {
            out.push_str(
                "  classDef missing stroke:#c00,stroke-width:2px,stroke-dasharray:5 5,color:#c00\n",
            );
            let _ = writeln!(out, "  class {} missing", missing_ids.join(","));
        }
        if !cycle_edges.is_empty() {
            let _ = writeln!(
                out,
                "  linkStyle {} stroke:#c00,stroke-width:2px,color:#c00",
                cycle_edges.join(",")
            );
        }
        out
    }

    pub fn format(&self, format: Format) -> String {
        match format {
            Format::Text => self.text(),
            Format::Dot => self.dot(),
            Format::Mermaid => self.mermaid(),
        }
    }
}

/// The state shown for `cluster`: the one its status records, else the one the operator's
/// first reconcile would write (`plan`), else `no status`.
fn state<F>(cluster: &CdnCluster, lookup: &F, plan: bool) -> (String, Option<String>)
where
    F: Fn(&str) -> Option<std::sync::Arc<CdnCluster>>,
{
    let recorded = cluster.status.clone().filter(|s| s.state.is_some());
    let status = match recorded {
        Some(status) => status,
        None if plan => {
            // Only whether it resolves is read, which does not depend on the domain.
            let resolved = sources::resolve(cluster, lookup, sources::DEFAULT_CLUSTER_DOMAIN);
            let observed = match &resolved {
                Err(problem) => Observed::Problem(problem),
                Ok(_) => Observed::Deployed(None, None),
            };
            // Only the state and the messages are read, which do not depend on the time.
            status::desired(cluster, observed, &Time(jiff::Timestamp::UNIX_EPOCH))
        }
        None => return ("no status".into(), None),
    };
    let state = status.state.expect("filtered or computed");
    let text = match &status.ready {
        Some(ready) => format!("{} {ready}", state.as_str()),
        None => state.as_str().to_string(),
    };
    let message = matches!(
        state,
        crate::api::State::Invalid | crate::api::State::WaitingSource | crate::api::State::Error
    )
    .then(|| {
        crate::reconcile::conditions::find(&status.conditions, status::READY)
            .map(|c| c.message.to_string())
    })
    .flatten();
    (text, message)
}

/// The clusters no other cluster of the namespace fetches from, then the others (a cycle has
/// no such entry point), each in name order.
fn roots(nodes: &[Node]) -> Vec<&Node> {
    let fetched: HashSet<&str> = nodes
        .iter()
        .flat_map(|n| &n.sources)
        .filter_map(|e| match &e.target {
            Target::Cluster(name) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let (mut roots, rest): (Vec<&Node>, Vec<&Node>) = nodes
        .iter()
        .partition(|n| !fetched.contains(n.name.as_str()));
    roots.extend(rest);
    roots
}

fn tree(
    nodes: &[Node],
    node: &Node,
    indent: &str,
    path: &mut Vec<String>,
    shown: &mut HashSet<String>,
    out: &mut String,
) {
    for (i, edge) in node.sources.iter().enumerate() {
        let last = i + 1 == node.sources.len();
        let (branch, next_indent) = if last {
            ("└── ", format!("{indent}    "))
        } else {
            ("├── ", format!("{indent}│   "))
        };
        let label = edge_label(edge);
        let _ = write!(out, "{indent}{branch}{label} → ");
        match &edge.target {
            Target::Cluster(name) => {
                // Targets are resolved among these very nodes.
                let Some(child) = nodes.iter().find(|n| &n.name == name) else {
                    let _ = writeln!(out, "{name}");
                    continue;
                };
                if path.contains(name) {
                    let mut cycle =
                        path[path.iter().position(|p| p == name).unwrap_or(0)..].to_vec();
                    cycle.push(name.clone());
                    let _ = writeln!(out, "{name} ↺ cycle: {}", cycle.join(" → "));
                } else if !shown.insert(name.clone()) {
                    let more = if child.sources.is_empty() {
                        ""
                    } else {
                        " (see above)"
                    };
                    let _ = writeln!(out, "{}{more}", describe(child));
                } else {
                    let _ = writeln!(out, "{}", describe(child));
                    path.push(name.clone());
                    tree(nodes, child, &next_indent, path, shown, out);
                    path.pop();
                }
            }
            Target::Missing(name) => {
                let _ = writeln!(out, "{name} ✗ missing: no such CdnCluster");
            }
            other => {
                let _ = writeln!(out, "{}: {}", edge.name, origin(other));
            }
        }
    }
}

/// `name [role] State ready: message`.
fn describe(node: &Node) -> String {
    let mut line = format!("{} [{}] {}", node.name, node.role.as_str(), node.state);
    if let Some(message) = &node.message {
        let _ = write!(line, ": {message}");
    }
    line
}

/// The origins and missing clusters the nodes fetch from, each once, in order.
fn leaves(nodes: &[Node]) -> Vec<Target> {
    let mut leaves: Vec<Target> = Vec::new();
    for edge in nodes.iter().flat_map(|n| &n.sources) {
        if !matches!(edge.target, Target::Cluster(_)) && !leaves.contains(&edge.target) {
            leaves.push(edge.target.clone());
        }
    }
    leaves
}

fn leaf_key(target: &Target) -> String {
    match target {
        Target::Url(url) => format!("url/{url}"),
        Target::Service { name, port } => format!("service/{name}:{port}"),
        Target::Cluster(name) | Target::Missing(name) => name.clone(),
    }
}

/// How an origin is shown.
fn origin(target: &Target) -> String {
    match target {
        Target::Url(url) => url.clone(),
        Target::Service { name, port } => format!("Service {name}:{port}"),
        Target::Cluster(name) | Target::Missing(name) => name.clone(),
    }
}

/// The paths an edge carries: its pathCondition, or `default` for the default source; a pool's
/// members say so, with their weight when it is not 1.
fn edge_label(edge: &Edge) -> String {
    let mut label = edge
        .path_condition
        .as_deref()
        .unwrap_or("default")
        .to_string();
    if edge.pool_size > 1 {
        let _ = write!(label, " (pool of {}", edge.pool_size);
        if edge.weight != 1 {
            let _ = write!(label, ", weight {}", edge.weight);
        }
        label.push(')');
    }
    if edge.cycle {
        format!("{label} (cycle)")
    } else {
        label.to_string()
    }
}

/// A DOT quoted string's content.
fn dot_escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A Mermaid quoted label's content: its entity codes for what would end or mark up the label.
fn mermaid_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '#' => out.push_str("#35;"),
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '&' => out.push_str("#amp;"),
            c => out.push(c),
        }
    }
    out
}

/// The CdnClusters of `namespace` (every namespace when `None`), as the API server has them.
pub async fn list(client: Client, namespace: Option<&str>) -> kube::Result<Vec<CdnCluster>> {
    let api: Api<CdnCluster> = match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    Ok(api.list(&ListParams::default()).await?.items)
}

/// Runs `cdn-operator graph`.
pub fn main(args: Args) -> ExitCode {
    let topology = if args.files.is_empty() {
        match from_cluster(&args) {
            Ok(t) => t,
            Err(error) => return crate::fail(&error),
        }
    } else {
        match Manifests::read(
            &args.files,
            args.namespace.as_deref(),
            std::io::stdin().lock(),
        ) {
            Ok(manifests) => {
                super::print_notes(&manifests.notes);
                Topology::of(&manifests.clusters, true)
            }
            Err(error) => return crate::fail(&error),
        }
    };
    super::print_out(&topology.format(args.output))
}

fn from_cluster(args: &Args) -> Result<Topology, String> {
    super::with_cluster(&args.kubeconfig, |client| async move {
        let namespace = match (&args.namespace, args.all_namespaces) {
            (_, true) => None,
            (Some(namespace), false) => Some(namespace.clone()),
            (None, false) => Some(client.default_namespace().to_string()),
        };
        let clusters = list(client, namespace.as_deref())
            .await
            .map_err(|e| format!("cannot list the CdnClusters: {e}"))?;
        Ok(Topology::of(&clusters, false))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CdnClusterSpec, Source};

    fn cluster(name: &str, role: Role, sources: Vec<Source>) -> CdnCluster {
        let mut c = CdnCluster::new(name, CdnClusterSpec::new(role, sources));
        c.metadata.namespace = Some("default".into());
        c
    }

    #[test]
    fn a_shared_cache_is_expanded_once() {
        let clusters = [
            cluster("a", Role::Balancer, vec![Source::cluster("shared", None)]),
            cluster("b", Role::Balancer, vec![Source::cluster("shared", None)]),
            cluster(
                "shared",
                Role::Cache,
                vec![Source::url("o", "http://o.example", None)],
            ),
        ];
        assert_eq!(
            Topology::of(&clusters, true).text(),
            "namespace default\n\n\
             a [balancer] Deploying 0/1\n\
             └── default → shared [cache] Deploying 0/1\n\
             \x20   └── default → o: http://o.example\n\n\
             b [balancer] Deploying 0/1\n\
             └── default → shared [cache] Deploying 0/1 (see above)\n"
        );
    }

    #[test]
    fn a_cycle_without_entry_is_still_shown() {
        let clusters = [
            cluster("x", Role::Cache, vec![Source::cluster("y", None)]),
            cluster("y", Role::Cache, vec![Source::cluster("x", None)]),
        ];
        let text = Topology::of(&clusters, true).text();
        assert!(
            text.contains("x [cache] Invalid: sources form a cycle: x → y → x\n"),
            "{text}"
        );
        assert!(
            text.contains("default (cycle) → x ↺ cycle: x → y → x"),
            "{text}"
        );
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(dot_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(
            mermaid_escape("#<a>&\"b\""),
            "#35;#lt;a#gt;#amp;#quot;b#quot;"
        );
    }
}
