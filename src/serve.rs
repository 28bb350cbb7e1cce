//! The accept loop: a cap on open connections with a few spare ones kept for the probes, header
//! and idle timeouts, JSON for requests hyper itself refuses, and a shutdown with a deadline after
//! which open connections are dropped. (`axum::serve` has none of these knobs, so connections are
//! served with hyper directly.)

mod parse_error;
mod stall;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::HttpConfig;
use crate::http::SpareConnection;

/// Serves `router` on `listener` until `stop` is cancelled; then open connections get
/// `shutdown_grace_s` to finish before they are dropped.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: &HttpConfig,
    stop: CancellationToken,
) -> std::io::Result<()> {
    // HTTP/1.1 only: every client of this API speaks it, and hyper's header timeout then covers
    // a connection from its first byte, idle keep-alive included.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(config.header_timeout_s));
    let mut one_request = builder.clone();
    one_request.keep_alive(false).header_read_timeout(
        SPARE_HEAD_TIMEOUT.min(Duration::from_secs_f64(config.header_timeout_s)),
    );
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let spare = Arc::new(Semaphore::new(PROBE_SLOTS));
    // Requests on spare connections are marked; the router answers only the probes on them.
    let probes = router.clone().layer(axum::Extension(SpareConnection {
        max_connections: config.max_connections,
    }));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        let slot = tokio::select! {
            biased;
            permit = Arc::clone(&slots).acquire_owned() => Slot::Full { _permit: permit.expect("the semaphore is never closed") },
            permit = Arc::clone(&spare).acquire_owned() => Slot::Spare { _permit: permit.expect("the semaphore is never closed") },
            _ = stop.cancelled() => break,
        };
        let (tcp, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors or a transient network error: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        // Events are small writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms to each.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let tcp = stall::WriteStall::new(tcp, Duration::from_secs_f64(config.send_timeout_s));
        let io = TokioIo::new(parse_error::JsonParseErrors::new(tcp));
        // A slot freed while this client waited for its accept: served in full after all.
        let slot = match slot {
            Slot::Spare { _permit } => match Arc::clone(&slots).try_acquire_owned() {
                Ok(full) => Slot::Full { _permit: full },
                Err(_) => Slot::Spare { _permit },
            },
            full => full,
        };
        let watched = match &slot {
            Slot::Full { .. } => graceful
                .watch(builder.serve_connection(io, TowerToHyperService::new(router.clone()))),
            Slot::Spare { .. } => graceful
                .watch(one_request.serve_connection(io, TowerToHyperService::new(probes.clone()))),
        };
        connections.spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
        // Reap finished connection tasks so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let grace = Duration::from_secs_f64(config.shutdown_grace_s);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = connections.len(),
            grace_s = config.shutdown_grace_s,
            "connections still open after the shutdown grace; dropping them"
        );
    }
    connections.shutdown().await;
    Ok(())
}

/// Connections accepted past `max_connections` to answer `/health` and `/ready` only (one request
/// each): while every slot is held, by slow uploads or long streams, the probes still answer and
/// other requests get a 503 instead of waiting unseen in the accept queue.
const PROBE_SLOTS: usize = 16;

/// How long a spare connection waits for its request head: a probe sends its few bytes at once,
/// and idle or trickling clients must not keep the spares from the probes for
/// `header_timeout_s`.
const SPARE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// The permit a connection holds while it is open.
enum Slot {
    /// One of `max_connections`: every route.
    Full { _permit: OwnedSemaphorePermit },
    /// One of [`PROBE_SLOTS`]: the probes, and a 503 for the rest.
    Spare { _permit: OwnedSemaphorePermit },
}

/// Raises the soft open-file limit to the hard one: every connection, pipe and job file is a
/// descriptor, and the common soft default of 1024 is easy to reach.
pub fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
