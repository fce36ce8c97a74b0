//! Shutdown on a signal: in-flight reconciles get the shutdown timeout to finish, then the
//! operator exits 0 either way.

use crate::fake_api::{cluster, FakeApi, FakeState};
use crate::launch::Launch;
use cdn_operator_testkit::{Operator, Signal, SIGINT, SIGTERM};
use std::time::{Duration, Instant};

/// One shutdown: a status write held for `status_delay` keeps a reconcile in flight when
/// `signal` arrives.
struct Case {
    name: &'static str,
    signal: Signal,
    status_delay: Duration,
    shutdown_timeout: &'static str,
    /// How many status writes completed by the exit.
    writes_done: usize,
    /// From the signal to the exit.
    took_at_least: Duration,
    took_less_than: Option<Duration>,
    /// What the operator logs about its in-flight reconciles.
    says: &'static str,
}

const CASES: [Case; 2] = [
    // The reconcile finishes within the timeout: the exit waits for it.
    Case {
        name: "sigterm_lets_an_in_flight_reconcile_finish_then_exits_0",
        signal: SIGTERM,
        status_delay: Duration::from_millis(1500),
        shutdown_timeout: "--shutdown-timeout=10s",
        writes_done: 1,
        took_at_least: Duration::from_millis(1000),
        took_less_than: None,
        says: "the controllers stopped",
    },
    // SIGINT (Ctrl-C in a terminal) takes the same path as SIGTERM; this reconcile outlasts the
    // timeout and is abandoned.
    Case {
        name: "sigint_abandons_a_reconcile_that_outlasts_the_shutdown_timeout_and_exits_0",
        signal: SIGINT,
        status_delay: Duration::from_secs(60),
        shutdown_timeout: "--shutdown-timeout=1s",
        writes_done: 0,
        took_at_least: Duration::from_millis(900),
        took_less_than: Some(Duration::from_secs(4)),
        says: "in-flight reconciles did not finish in time",
    },
];

#[test]
fn a_signal_lets_in_flight_reconciles_finish_within_the_shutdown_timeout_then_exits_0() {
    for case in CASES {
        let name = case.name;
        let api = FakeApi::start(FakeState {
            clusters: vec![cluster("origin")],
            status_delay: case.status_delay,
            ..FakeState::default()
        });
        let mut operator = Operator::start(
            &api.kubeconfig,
            &["--leader-elect=false", case.shutdown_timeout],
            &[],
        )
        .serving();
        operator.wait_for("a reconcile in flight", Duration::from_secs(30), |_| {
            api.state.lock().unwrap().status_writes_started == 1
        });
        operator.signal(case.signal);
        let signalled = Instant::now();
        let status = operator.wait_exit(Duration::from_secs(10));
        assert_eq!(
            status.code(),
            Some(0),
            "{name}: stderr:\n{}",
            operator.stderr()
        );
        let took = signalled.elapsed();
        assert_eq!(
            api.state.lock().unwrap().status_writes_done,
            case.writes_done,
            "{name}: whether the reconcile finished"
        );
        assert!(
            took >= case.took_at_least && case.took_less_than.is_none_or(|most| took < most),
            "{name}: {took:?}"
        );
        assert!(
            operator.stdout().contains(case.says),
            "{name}: {}",
            operator.stdout()
        );
    }
}
