//! `cdn-operator render`: the children the operator would create for some manifests, computed
//! offline by the controllers' own build step (`sources::resolve`, `build::children`,
//! `at::build::pod`), for review before they ship.

use super::manifests::{Index, Manifests};
use crate::at;
use crate::cdncluster::build::{self, Children, PodImages, Workload};
use crate::cdncluster::{sources, status};
use crate::kubernetes::restricted::RunAs;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Prints a multi-document YAML stream for `kubectl diff -f -` or `kubectl apply --dry-run=server -f -`:
for each CdnCluster its ConfigMap, Service and Deployment, for each At the pod that runs its command
when due. Sources are looked up among the given manifests only; nothing is read from a cluster.

An unapplied manifest has no uid, so the children carry no ownerReferences: a diff against live
objects shows those lines too. Manifests exported from the cluster (`kubectl get cdn -o yaml`)
carry their uids and render exactly what the operator applies, bar its applied-hash annotation.
Service names are written in the cluster domain of --cluster-domain, as the operator's own flag
sets it.

Exit status: 0 rendered; 1 a spec the operator would not deploy (on stderr, the message its Ready
condition would carry, Scheduled for an At; nothing on stdout), or unreadable input; 2 usage
error.")]
pub struct Args {
    /// Manifests: files, directories (their .yaml, .yml and .json files), or - for stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,

    /// Namespace of the objects whose manifest names none (default: default).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,

    /// Print only the generated nginx.conf of each CdnCluster.
    #[arg(long)]
    pub nginx_only: bool,

    /// The pods' user and groups, as the operator's own flags pin them.
    #[command(flatten)]
    pub pods: RunAs,

    /// The pods' images (nginx's default, the metrics sidecar), as the operator's own flags set them.
    #[command(flatten)]
    pub images: PodImages,

    /// The cluster's DNS domain, as the operator's own flag sets it.
    #[arg(long, default_value = sources::DEFAULT_CLUSTER_DOMAIN, value_parser = sources::parse_cluster_domain)]
    pub cluster_domain: String,
}

/// What the operator would create, in the order of the manifests.
#[derive(Debug)]
pub struct Rendered {
    pub clusters: Vec<Children>,
    pub pods: Vec<Pod>,
}

/// Builds the children of every object, or says, for each object the operator would not deploy,
/// what its Ready condition would say.
pub fn render(
    manifests: &Manifests,
    run_as: &RunAs,
    images: &PodImages,
    cluster_domain: &str,
) -> Result<Rendered, Vec<String>> {
    let index = Index::new(&manifests.clusters);
    // The operator's purge keys are its own, made in the cluster: not rendered (a diff against
    // the cluster shows its caches' ConfigMaps losing them).
    let pods = build::PodSettings {
        images: images.clone(),
        purge_keys: String::new(),
    };
    let mut problems = Vec::new();
    let mut clusters = Vec::new();
    for cluster in &manifests.clusters {
        let namespace = cluster.namespace().unwrap_or_default();
        match sources::resolve(cluster, index.lookup(&namespace), cluster_domain) {
            Ok(upstreams) => clusters.push(build::children(cluster, &upstreams, run_as, &pods)),
            Err(problem) => problems.push(format!(
                "CdnCluster {namespace}/{}: {}",
                cluster.name_any(),
                status::describe(&problem)
            )),
        }
    }
    let mut pods = Vec::new();
    for at in &manifests.ats {
        // The At controller refuses such a schedule with this message (condition Scheduled).
        match at::schedule::parse(&at.spec.schedule) {
            Ok(_) => pods.push(at::build::pod(at, run_as, &images.nginx)),
            Err(message) => problems.push(format!(
                "At {}/{}: {message}",
                at.namespace().unwrap_or_default(),
                at.name_any()
            )),
        }
    }
    if problems.is_empty() {
        Ok(Rendered { clusters, pods })
    } else {
        Err(problems)
    }
}

impl Rendered {
    /// The objects as one YAML stream, in the order the operator applies them.
    pub fn yaml(&self) -> String {
        let mut documents = Vec::new();
        for children in &self.clusters {
            documents.push(to_yaml(&children.config_map));
            documents.push(to_yaml(&children.service));
            documents.push(match &children.workload {
                Workload::Deployment(deployment) => to_yaml(deployment),
                Workload::StatefulSet(stateful_set) => to_yaml(stateful_set),
            });
            if let Some(budget) = &children.pod_disruption_budget {
                documents.push(to_yaml(budget));
            }
            if let Some(ingress) = &children.ingress {
                documents.push(to_yaml(ingress));
            }
        }
        documents.extend(self.pods.iter().map(to_yaml));
        documents.join("---\n")
    }

    /// The nginx.conf of every CdnCluster, one after the other (each names its cluster in its
    /// first line).
    pub fn nginx(&self) -> String {
        self.clusters
            .iter()
            .filter_map(|c| c.config_map.data.as_ref()?.get(build::CONFIG_KEY).cloned())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn to_yaml<T: Serialize>(object: &T) -> String {
    serde_yaml::to_string(object).expect("Kubernetes objects always serialize")
}

/// Runs `cdn-operator render`.
pub fn main(args: Args) -> ExitCode {
    let manifests = match Manifests::read(
        &args.files,
        args.namespace.as_deref(),
        std::io::stdin().lock(),
    ) {
        Ok(m) => m,
        Err(error) => return crate::fail(&error),
    };
    super::print_notes(&manifests.notes);
    match render(&manifests, &args.pods, &args.images, &args.cluster_domain) {
        Ok(rendered) if args.nginx_only => super::print_out(&rendered.nginx()),
        Ok(rendered) => super::print_out(&rendered.yaml()),
        Err(problems) => {
            for problem in problems {
                eprintln!("cdn-operator: {problem}");
            }
            ExitCode::FAILURE
        }
    }
}
