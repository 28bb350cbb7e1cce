//! Subcommands that act as clients or one-off runners (the server itself lives in the library).

pub(crate) mod control;
pub(crate) mod lease;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod speakers;
pub(crate) mod status;
pub(crate) mod transcribe;
