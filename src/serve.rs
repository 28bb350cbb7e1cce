//! The accept loop: a cap on open connections, header and idle timeouts, JSON for requests
//! hyper itself refuses, and a shutdown with a deadline after which open connections are dropped.
//! (`axum::serve` has none of these knobs, so connections are served with hyper directly.)

mod parse_error;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::config::HttpConfig;

/// Serves `router` on `listener` until `stop` turns true; then open connections get
/// `shutdown_grace_s` to finish before they are dropped.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: &HttpConfig,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    // HTTP/1.1 only: every client of this API speaks it, and hyper's header timeout then covers
    // a connection from its first byte, idle keep-alive included.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(config.header_timeout_s));
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stopped(&mut stop) => break,
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
            _ = stopped(&mut stop) => break,
        };
        // Events are small writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms to each.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let io = TokioIo::new(parse_error::JsonParseErrors::new(tcp));
        let service = TowerToHyperService::new(router.clone());
        let watched = graceful.watch(builder.serve_connection(io, service));
        connections.spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
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

/// Resolves once `stop` turns true (the `Ref` of `wait_for` is not `Send`, so it ends here).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await;
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
