//! Golden outputs of `cdn-operator render` and `graph`, beside this file. `UPDATE_GOLDEN=1 cargo
//! test --test render --test graph` rewrites them; review the diff by eye before committing.
//! Included with `tests/support` (`mod golden; mod support;`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The seed examples, in ../shared beside the repository (as CI has them).
pub fn seed_examples() -> PathBuf {
    crate::support::shared("seed-examples")
}

/// A file of this folder.
pub fn input(name: &str) -> PathBuf {
    root().join("tests/golden").join(name)
}

/// Asserts that `actual` is the golden file `name`, or writes it with `UPDATE_GOLDEN=1`.
pub fn check(name: &str, actual: &str) {
    let path = input(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; UPDATE_GOLDEN=1 writes it from the current output",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs from the output (UPDATE_GOLDEN=1 rewrites it, then review the diff):\n{}",
        path.display(),
        first_difference(&expected, actual)
    );
}

fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let line = e
        .iter()
        .zip(&a)
        .position(|(x, y)| x != y)
        .unwrap_or(e.len().min(a.len()));
    format!(
        "line {}:\n- {}\n+ {}",
        line + 1,
        e.get(line).unwrap_or(&"<end>"),
        a.get(line).unwrap_or(&"<end>")
    )
}

/// What the real binary did: exit code, stdout, stderr.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts the run exited `code` with one line on stderr, starting with `prefix`.
    pub fn fails_in_one_line(&self, code: i32, prefix: &str) {
        assert_eq!(self.code, code, "{}", self.stderr);
        assert!(self.stderr.starts_with(prefix), "{}", self.stderr);
        assert_eq!(self.stderr.lines().count(), 1, "{}", self.stderr);
    }
}

/// `cdn-operator ARGS` with no cluster: KUBECONFIG points nowhere, so a command that tried to
/// reach one would fail.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cdn-operator"));
    command
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST");
    command
}

/// Runs `cdn-operator ARGS` with `stdin`, and no cluster (see [`command`]).
pub fn cdn_operator(args: &[&str], stdin: &str) -> Run {
    let out =
        cdn_operator_testkit::run_with_stdin(&mut command(args), stdin).expect("run cdn-operator");
    Run {
        code: out.status.code().expect("exited"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

pub fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
