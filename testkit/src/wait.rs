//! Polling, for what a test can only observe from outside.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every `every` until it gives a value; `None` once `within` has passed.
pub async fn poll<T, F, Fut>(within: Duration, every: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `check` every 200 ms until it gives a value; panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(timeout, Duration::from_millis(200), check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Runs `future` on a runtime of its own: the polling above, for a synchronous test. Not from
/// inside a runtime (tokio refuses to nest them): see [`on_own_thread`].
pub fn blocking<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// Runs `future` on a thread and a runtime of its own, for a `Drop` (which cannot await, and may
/// run inside the test's runtime). `Err` when it panicked.
pub fn on_own_thread<F>(future: F) -> std::thread::Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || blocking(future)).join()
}

/// Calls `observe` every `every` until `done` holds for what it gives or `within` has passed, and
/// returns the last observation: for a synchronous test, which then asserts on it (so a timeout
/// shows what was seen last).
pub fn settle<T>(
    within: Duration,
    every: Duration,
    mut observe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let seen = observe();
        if done(&seen) || Instant::now() >= deadline {
            return seen;
        }
        std::thread::sleep(every);
    }
}
