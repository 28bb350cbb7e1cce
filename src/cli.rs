//! Subcommands that act as clients or one-off runners (the server itself lives in the library).

pub mod control;
pub mod lease;
pub mod progress;
pub mod run;
pub mod status;
pub mod transcribe;
