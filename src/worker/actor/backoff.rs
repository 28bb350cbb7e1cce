//! When a failing worker is tried again: the backoff between restarts, and when a process
//! counts as having worked (so its going down starts the count anew).

use std::time::Duration;

/// Longest wait between restart attempts of a worker that keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The first restart is immediate; repeated failures wait 0.5 s, 1 s, 2 s … up to 30 s, and a
/// worker that has failed [`PERSISTENT`] times in a row (a broken venv, weights missing: every
/// try spent seconds of CPU importing its libraries, and as many log lines) waits on, doubling
/// to 5 min. A job that needs it tries at once whatever the wait.
pub(super) fn backoff(failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let exp = (failures - 2).min(16);
    let quick = (Duration::from_millis(500) * 2u32.pow(exp)).min(MAX_BACKOFF);
    match failures.checked_sub(PERSISTENT) {
        Some(more) if more > 0 => (MAX_BACKOFF * 2u32.pow(more.min(4))).min(MAX_PERSISTENT_BACKOFF),
        _ => quick,
    }
}

/// Up this long, a process that goes down is a new failure, not one more in a row.
pub(super) const STABLE_UP: Duration = Duration::from_secs(60);

/// Failures in a row after which a worker is left alone longer between tries.
const PERSISTENT: u32 = 12;
const MAX_PERSISTENT_BACKOFF: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), Duration::from_millis(500));
        assert_eq!(backoff(3), Duration::from_secs(1));
        assert_eq!(backoff(12), Duration::from_secs(30));
        // Failing for good: left alone longer, to 5 min.
        assert_eq!(backoff(13), Duration::from_secs(60));
        assert_eq!(backoff(14), Duration::from_secs(120));
        assert_eq!(backoff(16), Duration::from_secs(300));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
    }
}
