//! The shutdown request: SIGTERM (what the kubelet sends) or SIGINT, or a programmatic trigger.
//! Every part of the runtime waits on the same request: a `CancellationToken` (tokio-util), which
//! wakes every waiter, late ones at once.

pub use tokio_util::sync::CancellationToken as Shutdown;

/// Cancels `shutdown` on SIGTERM or SIGINT. The handlers are installed before this returns, so a
/// signal right after is not lost. Call inside a Tokio runtime.
pub fn on_signals(shutdown: &Shutdown) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown requested");
        shutdown.cancel();
    });
    Ok(())
}
