//! `cdn-operator release-finalizers`: the uninstall step that releases every At pod's finalizer
//! (see [`crate::at::uninstall`]). The Helm chart runs it as a pre-delete hook; a kustomize or OLM
//! uninstall runs it by hand first (docs/install.md, Uninstalling).

use crate::at::uninstall;
use crate::kubernetes::cache::Scope;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Run it when the operator is being removed, not on a restart or an upgrade: the finalizer keeps the
pod of a RUNNING At from vanishing unseen, and an operator that is gone can release it no more.
Prints the pods released, one `namespace/name` a line.

Exit status: 0 released (or nothing to release); 1 the pods could not be listed or released.")]
pub struct Args {
    /// Release the At pods of this namespace only (a single-namespace install); default: every
    /// namespace.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    #[command(flatten)]
    pub kubeconfig: crate::kubernetes::client::Kubeconfig,
}

pub fn main(args: Args) -> ExitCode {
    let scope = match args.namespace {
        Some(ns) if !ns.is_empty() => Scope::Namespace(ns),
        _ => Scope::All,
    };
    let released = super::with_cluster(&args.kubeconfig, |client| async move {
        uninstall::release_all(&client, &scope)
            .await
            .map_err(|e| e.to_string())
    });
    match released {
        Ok(pods) => {
            if pods.is_empty() {
                eprintln!("cdn-operator: no At pod held");
            }
            super::print_out(
                &pods
                    .iter()
                    .map(|pod| format!("{pod}\n"))
                    .collect::<String>(),
            )
        }
        Err(message) => crate::fail(&message),
    }
}
