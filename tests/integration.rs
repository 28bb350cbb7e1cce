//! Integration tests: the real server on port 0, real worker processes, real HTTP.
#![allow(clippy::unwrap_used, unreachable_pub)] // test and bench code: a panic is the failure report
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)] // tests start the gpuhost binary and helper processes directly

mod integration {
    pub mod arbiter;
    pub mod support;

    mod audio_formats;
    mod cancel;
    mod cli;
    mod dashboard;
    mod disk;
    mod faults;
    mod golden;
    pub mod gpu_status;
    mod hardening;
    mod http_api;
    mod lifecycle;
    mod original_protocol;
    mod parallel;
    mod queue;
    mod requests;
    mod setup;
    mod slow_clients;
    mod speakers;
    mod style;
    mod unload;
    mod watched;
    mod wyoming;
}
