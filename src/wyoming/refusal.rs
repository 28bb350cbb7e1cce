//! Why a Wyoming event is refused: the `error` event's code and text, told apart as the HTTP
//! doors tell them (the client's mistake, a full disk, the server's own trouble).

use crate::job;

/// Why an event is refused: the `error` event's code and text.
pub(super) struct Refusal {
    pub(super) code: &'static str,
    pub(super) text: String,
}

impl Refusal {
    pub(super) fn no_space(e: &job::NoSpace) -> Refusal {
        Refusal {
            code: "insufficient_storage",
            text: e.to_string(),
        }
    }

    /// The audio could not be written to the job folder: the server's trouble, not the
    /// client's; a full disk (between two `ROOM_EVERY` checks) says so.
    pub(super) fn not_stored(e: hound::Error) -> Refusal {
        match e {
            hound::Error::IoError(io) => Refusal::io("store the audio", &io),
            e => Refusal {
                code: "internal",
                text: format!("cannot store the audio: {e}"),
            },
        }
    }

    /// A failed write of the server's own (`what`: "store the audio").
    pub(super) fn io(what: &str, e: &std::io::Error) -> Refusal {
        if job::is_disk_full(e) {
            return Refusal {
                code: "insufficient_storage",
                text: job::DISK_FULL.into(),
            };
        }
        Refusal {
            code: "internal",
            text: format!("cannot {what}: {e}"),
        }
    }
}

/// The client's mistake.
impl From<String> for Refusal {
    fn from(text: String) -> Refusal {
        Refusal {
            code: "bad_request",
            text,
        }
    }
}

impl From<&str> for Refusal {
    fn from(text: &str) -> Refusal {
        Refusal::from(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_from_the_clients_mistake_and_the_servers_trouble() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(
            Refusal::io("store the audio", &full).code,
            "insufficient_storage"
        );
        let refused = Refusal::not_stored(hound::Error::IoError(full));
        assert_eq!(refused.code, "insufficient_storage");
        assert!(refused.text.contains("no space left"), "{}", refused.text);
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        let other = Refusal::io("create a job folder", &denied);
        assert_eq!(other.code, "internal");
        assert!(
            other.text.starts_with("cannot create a job folder"),
            "{}",
            other.text
        );
        assert_eq!(Refusal::from("bad chunk").code, "bad_request");
    }
}
