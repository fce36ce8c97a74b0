//! The flags as kubebuilder users type them, on the built binary: `--kubeconfig` (which wins over
//! KUBECONFIG) and `--zap-log-level`.

use crate::fake_api::{FakeApi, FakeState};
use crate::launch::Launch;
use cdn_operator_testkit::Operator;

#[test]
fn kubeconfig_wins_over_the_environment_and_zap_levels_set_the_log_level() {
    let api = FakeApi::start(FakeState::default());
    let dir = tempfile::tempdir().unwrap();
    // KUBECONFIG names a broken file: only --kubeconfig can connect the operator.
    let broken = dir.path().join("broken");
    std::fs::write(&broken, "clusters: [\n").unwrap();
    let kubeconfig = format!("--kubeconfig={}", api.kubeconfig.display());
    let args = [
        "--leader-elect=false",
        "--log-format=json",
        "--zap-log-level=debug",
        kubeconfig.as_str(),
    ];
    let mut operator = Operator::start(&broken, &args, &[]).serving();
    operator.ready("ready, connected through --kubeconfig");
    operator.terminate();
    let logs = operator.stdout();
    assert!(logs.contains(r#""level":"DEBUG""#), "{logs}");
}
