//! The offline and read-only commands for the people who run the CDN: `render` (the children the
//! operator would create, for review) and `graph` (the topology). Both use the controllers' own
//! build steps, so what they show is what the operator does.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

pub mod graph;
pub mod manifests;
pub mod release_finalizers;
pub mod render;
pub mod sign_url;

/// The objects skipped in the input, one line each on stderr.
/// Runs `work` with a client of the cluster `kubeconfig` names, on a runtime of its own (the
/// commands that read or write a cluster once and exit); every failure as one message.
fn with_cluster<T, F>(
    kubeconfig: &crate::kubernetes::client::Kubeconfig,
    work: impl FnOnce(kube::Client) -> F,
) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, String>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        let client = crate::kubernetes::client::connect(kubeconfig, None)
            .await
            .map_err(|e| format!("cannot reach the cluster: {e}"))?;
        work(client).await
    })
}

fn print_notes(notes: &[String]) {
    for note in notes {
        eprintln!("cdn-operator: {note}");
    }
}

/// Writes a command's whole output to stdout. A reader that stops early (`| head`) ends the
/// output there, quietly and with success, as with any Unix tool; any other write error fails.
pub fn print_out(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => crate::fail(&format!("cannot write the output: {error}")),
    }
}
