//! The orphan guard's mark: `GPUHOST_GUARD=<host pid>-<nanos>` in every child's environment,
//! inherited by what the child starts (a gpuhost started by another keeps the outer token
//! before its own, space-separated), and the scan that finds its holders when the host dies.

use std::sync::OnceLock;
use std::time::Duration;

use super::life::Seen;
use crate::gpu::procfs::ProcFs;

/// The environment variable that marks this host's children.
pub const MARK_VAR: &str = "GPUHOST_GUARD";

/// This host's value of it, once a guard runs.
static MARK: OnceLock<String> = OnceLock::new();

/// This host's mark for its children's environment, once a guard runs (else `None`: no guard
/// would look for it).
pub(in crate::process) fn mark() -> Option<&'static str> {
    MARK.get().map(String::as_str)
}

/// A new host's `(token, mark)`: its own token, and the value its children get.
pub(super) fn new(host: u32) -> (String, String) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // The pid and the moment: no other host, before or after, has the same.
    let token = format!("{host}-{nanos}");
    // A host started by another gpuhost keeps that one's mark beside its own: both guards then
    // find what this host starts.
    let mark = match std::env::var(MARK_VAR) {
        Ok(outer) if !outer.trim().is_empty() => format!("{} {token}", outer.trim()),
        _ => token.clone(),
    };
    (token, mark)
}

/// Records the mark once the guard runs.
pub(super) fn set(mark: String) {
    let _ = MARK.set(mark);
}

/// Every process whose environment's mark holds `token`, but `me`, with its start time.
fn marked(procfs: &ProcFs, token: &str, me: u32) -> Seen {
    let has_token = |value: &[u8]| value.split(|&b| b == b' ').any(|t| t == token.as_bytes());
    procfs
        .pids()
        .into_iter()
        .filter(|&p| {
            p != me
                && p > 1
                && procfs
                    .environ_value(p, MARK_VAR)
                    .is_some_and(|v| has_token(&v))
        })
        .filter_map(|p| Some((p, procfs.start_time(p)?)))
        .collect()
}

/// [`marked`], given up after 2 s: reading a process's environment waits for its memory map,
/// and one process stuck in the kernel (a GPU driver call) must not hold up the cleanup. The
/// scan's thread is left behind; the guard's exit ends it.
pub(super) fn marked_soon(token: &str, me: u32) -> Seen {
    let (tx, rx) = std::sync::mpsc::channel();
    let token = token.to_string();
    let scan = std::thread::Builder::new().spawn(move || {
        let _ = tx.send(marked(&ProcFs::new("/proc"), &token, me));
    });
    match scan {
        Ok(_) => rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default(),
        Err(_) => Seen::new(),
    }
}
