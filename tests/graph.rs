//! `cdn-operator graph`: golden outputs of the real binary (text, DOT, Mermaid) for the seed
//! examples, the README's example topology and an invalid topology; DOT checked by Graphviz's
//! `dot`, Mermaid rendered by the Mermaid CLI (`mmdc`, with Debian's chromium); the cluster read
//! through the in-memory API.

mod golden;
mod support;

use cdn_operator::cli::graph::{list, Topology};
use golden::{cdn_operator, check, input, path, root, seed_examples};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The topologies of the goldens: name, manifests.
fn topologies() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("seed", seed_examples()),
        ("example", root().join("examples/topology.yaml")),
        ("pool", root().join("examples/pool.yaml")),
        ("invalid", input("invalid-topology.yaml")),
        ("tricky", input("tricky-labels.yaml")),
    ]
}

fn graph(manifests: &Path, format: &str) -> String {
    let run = cdn_operator(&["graph", "-o", format, "-f", path(manifests)], "");
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (0, ""),
        "a broken topology is shown, not an error; no cluster is needed with -f"
    );
    run.stdout
}

#[test]
fn the_topologies_graph_as_golden() {
    for (name, manifests) in topologies() {
        for (format, extension) in [("text", "txt"), ("dot", "dot"), ("mermaid", "mmd")] {
            check(
                &format!("graph-{name}.{extension}"),
                &graph(&manifests, format),
            );
        }
    }
    // The default is the text tree.
    let run = cdn_operator(&["graph", "-f", path(&seed_examples())], "");
    assert_eq!(run.stdout, graph(&seed_examples(), "text"));
}

#[test]
fn missing_sources_and_cycles_are_shown() {
    let text = graph(&input("invalid-topology.yaml"), "text");
    assert!(text.contains("^/ghost/ → ghost ✗ missing: no such CdnCluster"));
    assert!(text.contains("loop [cache] Invalid: sources form a cycle: loop → back → loop"));
    assert!(text.contains("default (cycle) → loop ↺ cycle: loop → back → loop"));
    assert!(
        text.contains("edge [balancer] WaitingSource: Source ghost not found, will retry later")
    );
    let dot = graph(&input("invalid-topology.yaml"), "dot");
    assert!(dot.contains("\"default/missing/ghost\" [style=\"dashed,bold\", color=red"));
    assert_eq!(
        dot.matches("color=red, fontcolor=red, penwidth=2").count(),
        2
    );
    let mermaid = graph(&input("invalid-topology.yaml"), "mermaid");
    assert!(mermaid.contains("class o0_0 missing"));
    assert!(mermaid.contains("linkStyle 0,4 stroke:#c00"));
}

/// Graphviz's `dot` (Debian package graphviz, installed by scripts/install-test-deps.sh) lays out
/// every DOT output without a warning.
#[test]
fn dot_accepts_the_dot_output() {
    for (name, manifests) in topologies() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(format!("{name}.dot"));
        std::fs::write(&file, graph(&manifests, "dot")).unwrap();
        let out = Command::new("dot")
            .arg("-Tsvg")
            .arg(&file)
            .output()
            .expect("graphviz's dot must be installed: run scripts/install-test-deps.sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{name}: {stderr}"
        );
        let svg = String::from_utf8(out.stdout).unwrap();
        assert!(svg.contains("<svg"), "{name}");
        assert!(svg.contains("namespace "), "{name}");
    }
}

/// The Mermaid CLI (npm @mermaid-js/mermaid-cli, rendering in Debian's chromium; both installed by
/// scripts/install-test-deps.sh) renders every Mermaid output and the README's Mermaid block, in
/// one browser start: a markdown file with all of them.
#[test]
fn mermaid_renders_the_mermaid_output_and_the_readme() {
    let dir = tempfile::tempdir().unwrap();
    let mut markdown = String::new();
    let mut count = 0;
    for (_, manifests) in topologies() {
        markdown.push_str(&format!(
            "```mermaid\n{}```\n\n",
            graph(&manifests, "mermaid")
        ));
        count += 1;
    }
    markdown.push_str(&format!("```mermaid\n{}```\n", readme_mermaid()));
    count += 1;
    let source = dir.path().join("graphs.md");
    std::fs::write(&source, markdown).unwrap();
    let browser = dir.path().join("puppeteer.json");
    // As root, chromium runs only without its sandbox (the page is our own); with no network,
    // its background connections are only noise.
    let args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ];
    std::fs::write(
        &browser,
        json!({"executablePath": chromium(), "args": args}).to_string(),
    )
    .unwrap();
    let out = Command::new("mmdc")
        .arg("-p")
        .arg(&browser)
        .arg("-i")
        .arg(&source)
        .arg("-o")
        .arg(dir.path().join("out.md"))
        .output()
        .expect("the Mermaid CLI (mmdc) must be installed: run scripts/install-test-deps.sh");
    assert!(
        out.status.success(),
        "mmdc refused a diagram:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 1..=count {
        let svg = std::fs::read_to_string(dir.path().join(format!("out-{i}.svg")))
            .unwrap_or_else(|e| panic!("diagram {i} was not rendered: {e}"));
        assert!(svg.contains("namespace "), "diagram {i}");
        assert!(!svg.contains("Syntax error"), "diagram {i}");
    }
}

fn chromium() -> &'static str {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium (Debian package) must be installed: run scripts/install-test-deps.sh")
}

/// The README's Mermaid block.
fn readme_mermaid() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("```mermaid\n")
        .expect("the README shows the example topology as a Mermaid block")
        + "```mermaid\n".len();
    let end = start + readme[start..].find("```").unwrap();
    readme[start..end].to_string()
}

#[test]
fn the_readme_shows_the_graph_of_the_example_topology() {
    assert_eq!(
        readme_mermaid(),
        graph(&root().join("examples/topology.yaml"), "mermaid"),
        "README.md's Mermaid block is `cdn-operator graph -o mermaid -f examples/topology.yaml`"
    );
}

fn cluster(
    namespace: &str,
    name: &str,
    sources: serde_json::Value,
    status: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut object = json!({
        "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"role": if sources.as_array().unwrap().is_empty() { "cache" } else { "balancer" }, "sources": sources},
    });
    if let Some(status) = status {
        object["status"] = status;
    }
    object
}

/// From the cluster: the state and ready replicas the status records; a cluster the operator has
/// not reconciled yet says so; a namespace, or all of them.
#[tokio::test]
async fn from_the_cluster_the_status_tells_the_state() {
    let running = json!({"state": "Running", "replicas": 2, "readyReplicas": 2, "ready": "2/2"});
    let fake = support::FakeApi::with_objects(vec![
        cluster(
            "default",
            "front",
            json!([{"name": "cache"}, {"name": "gone", "pathCondition": "^/old/"}]),
            Some(json!({
            "state": "WaitingSource",
            "conditions": [{"type": "Ready", "status": "False", "reason": "WaitingSource",
                "message": "Source gone not found, will retry later",
                "lastTransitionTime": "2025-01-01T00:00:00Z"}]})),
        ),
        cluster("default", "cache", json!([]), Some(running)),
        cluster("other", "fresh", json!([]), None),
    ])
    .await;

    let clusters = list(fake.client.clone(), Some("default")).await.unwrap();
    assert_eq!(
        Topology::of(&clusters, false).text(),
        "namespace default\n\n\
         front [balancer] WaitingSource: Source gone not found, will retry later\n\
         ├── default → cache [cache] Running 2/2\n\
         └── ^/old/ → gone ✗ missing: no such CdnCluster\n"
    );
    let every = list(fake.client.clone(), None).await.unwrap();
    let text = Topology::of(&every, false).text();
    assert!(
        text.ends_with("namespace other\n\nfresh [cache] no status\n"),
        "{text}"
    );
}

#[test]
fn without_files_it_needs_a_cluster_and_says_so() {
    let run = cdn_operator(&["graph"], "");
    run.fails_in_one_line(1, "cdn-operator: cannot reach the cluster: ");
    let usage = cdn_operator(&["graph", "-A", "-f", "x.yaml"], "");
    assert_eq!(usage.code, 2);
    let usage = cdn_operator(&["graph", "-o", "png"], "");
    assert_eq!(usage.code, 2);
}

#[test]
fn a_pool_is_shown_on_the_edges_of_its_members() {
    let text = graph(&root().join("examples/pool.yaml"), "text");
    assert!(
        text.contains("├── default (pool of 3) → cache-1 [cache]"),
        "{text}"
    );
    assert!(
        text.contains("└── default (pool of 3, weight 2) → cache-3 [cache]"),
        "{text}"
    );
}
