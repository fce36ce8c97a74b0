//! The offline and read-only commands for the people who run the CDN: `render` (the children the
//! operator would create, for review) and `graph` (the topology). Both use the controllers' own
//! build steps, so what they show is what the operator does.

pub mod graph;
pub mod manifests;
pub mod render;

/// The objects skipped in the input, one line each on stderr.
fn print_notes(notes: &[String]) {
    for note in notes {
        eprintln!("cdn-operator: {note}");
    }
}
