//! The shutdown request: SIGTERM (what the kubelet sends) or SIGINT, or a programmatic trigger.
//! Every part of the runtime waits on the same request.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Clone)]
pub struct Shutdown {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Shutdown {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Requests shutdown on SIGTERM or SIGINT. The handlers are installed before this returns, so
    /// a signal right after is not lost. Call inside a Tokio runtime.
    pub fn on_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutdown requested");
            this.trigger();
        });
        Ok(())
    }

    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_requested(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once shutdown is requested (at once if it already was).
    pub fn requested(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let rx = self.tx.subscribe();
        async move {
            let mut rx = rx;
            // The sender lives as long as any clone of Shutdown; if all are gone, nobody can
            // request shutdown any more and this waits forever, which is right.
            if rx.wait_for(|requested| *requested).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_waiter_wakes_and_late_ones_too() {
        let shutdown = Shutdown::new();
        let early = tokio::spawn(shutdown.requested());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!early.is_finished());
        assert!(!shutdown.is_requested());
        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(1), early)
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), shutdown.requested())
            .await
            .unwrap();
        assert!(shutdown.is_requested());
    }
}
