//! The user's tools the node tests drive, `helm` and `kubectl`: finding `helm`, running a tool
//! with its exit status checked, what a failing test prints of a namespace, and the relative
//! paths kustomize asks for. Depends on no other file of `node`.

use std::path::{Component, Path, PathBuf};
use std::process::{Command, Output};

/// How long `helm` and `kubectl` operations may wait (hooks, deletions).
pub const TOOL_TIMEOUT: &str = "5m";

/// `helm`: `HELM`, else `helm` on PATH, else where `scripts/install-helm.sh` puts it for the
/// artifact checks (`~/.cache/cdn-operator-tools/bin/helm`).
pub fn helm() -> PathBuf {
    if let Some(path) = std::env::var_os("HELM").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join("helm").is_file()))
        .unwrap_or(false);
    if on_path {
        return "helm".into();
    }
    let cached = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/cdn-operator-tools/bin/helm"))
        .filter(|p| p.is_file());
    cached.unwrap_or_else(|| {
        panic!("no helm: set HELM, put helm on PATH, or run scripts/install-helm.sh ~/.cache/cdn-operator-tools")
    })
}

/// Runs `command` to the end: its stdout; panics with its exit status, stdout and stderr when
/// it fails.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {:?}: {e}", command.get_program()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// What a failing test prints of namespace `ns`: its objects, the CdnClusters' and Ats' status,
/// its Events, `kubectl describe pods`, and every pod's logs (all containers, the previous run's
/// too where a container restarted).
pub fn diagnostics(ns: &str) -> String {
    let kubectl = |args: &[&str]| -> String {
        let shown = format!("--- $ kubectl {} -n {ns}", args.join(" "));
        match Command::new("kubectl").args(args).args(["-n", ns]).output() {
            Ok(out) => format!(
                "{shown}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("{shown}\n{e}\n"),
        }
    };
    let mut text = String::new();
    text += &kubectl(&[
        "get",
        "pods,deployments,replicasets,services,endpointslices,jobs,leases",
        "-o",
        "wide",
    ]);
    text += &kubectl(&["get", "cdnclusters,ats", "-o", "yaml"]);
    text += &kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
    text += &kubectl(&["describe", "pods"]);
    let pods = Command::new("kubectl")
        .args(["get", "pods", "-o", "name", "-n", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for pod in pods.lines().filter(|l| !l.is_empty()) {
        text += &kubectl(&["logs", pod, "--all-containers", "--prefix", "--tail=300"]);
        let previous = Command::new("kubectl")
            .args([
                "logs",
                pod,
                "--all-containers",
                "--prefix",
                "--previous",
                "-n",
                ns,
            ])
            .output();
        if let Some(out) = previous
            .ok()
            .filter(|o| o.status.success() && !o.stdout.is_empty())
        {
            text += &format!(
                "--- previous run of {pod}\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    text
}

/// A tool's exit status and output, or why it did not run, for a cleanup's message.
pub(super) fn outcome(output: &std::io::Result<Output>) -> String {
    match output {
        Ok(o) => format!(
            "{}: {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => e.to_string(),
    }
}

/// `to` relative to directory `from`, both absolute: kustomize refuses absolute resource paths.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for component in &to[common..] {
        path.push(component.as_os_str());
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlay_reaches_the_base_by_a_relative_path() {
        assert_eq!(
            relative_path(
                Path::new("/tmp/.tmpAbC"),
                Path::new("/work/x/kustomize/base")
            ),
            PathBuf::from("../../work/x/kustomize/base")
        );
        assert_eq!(
            relative_path(Path::new("/work/x/t"), Path::new("/work/x/kustomize/base")),
            PathBuf::from("../kustomize/base")
        );
    }
}
