//! The binary's allocator and its options, as jemalloc itself reports them.

use std::process::Command;

#[test]
fn the_binary_allocates_with_jemalloc_in_one_arena_returning_freed_pages_at_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
        .arg("version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("the binary runs");
    assert!(output.status.success(), "{output:?}");
    // jemalloc prints its statistics to stderr at exit; none at all without jemalloc.
    let stats = String::from_utf8_lossy(&output.stderr);
    for option in [
        "opt.narenas: 1\n",
        "opt.dirty_decay_ms: 0 ",
        "opt.muzzy_decay_ms: 0 ",
    ] {
        assert!(
            stats.contains(option),
            "{option:?} is not in jemalloc's statistics:\n{stats}"
        );
    }
}
