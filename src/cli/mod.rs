//! The offline and read-only commands for the people who run the CDN: `render` (the children the
//! operator would create, for review) and `graph` (the topology). Both use the controllers' own
//! build steps, so what they show is what the operator does.

pub mod graph;
pub mod manifests;
pub mod render;

use std::process::ExitCode;

/// A failure of a command: one line on stderr, exit code 1.
fn fail(message: &str) -> ExitCode {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    eprintln!("cdn-operator: {line}");
    ExitCode::FAILURE
}

/// The objects skipped in the input, one line each on stderr.
fn print_notes(notes: &[String]) {
    for note in notes {
        eprintln!("cdn-operator: {note}");
    }
}
