//! `audio-stop`: the received audio becomes a job in the GPU queue, and its final event becomes
//! the connection's `transcript` or `error`. A client that hangs up meanwhile cancels the job.

use std::sync::Arc;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;

use super::event::write_event;
use super::{Audio, Connection, ConnectionError};
use crate::audio::{AudioError, Source};
use crate::job::{self, PreparedJob};
use crate::protocol::{ClientEvent, JobOptions};
use crate::transcript::Transcript;

impl Connection {
    /// `audio-stop`: runs the job and answers `transcript` or `error`.
    pub(super) async fn transcribe(&mut self) -> Result<Result<(), String>, ConnectionError> {
        let Audio::Receiving {
            dir,
            path,
            writer,
            bytes,
            ..
        } = std::mem::replace(&mut self.audio, Audio::Idle)
        else {
            return Ok(Err("`audio-stop` before `audio-start`".into()));
        };
        if bytes == 0 {
            return Ok(Err("no audio between `audio-start` and `audio-stop`".into()));
        }
        if let Err(e) = writer.finalize() {
            return Ok(Err(format!("cannot store the audio: {e}")));
        }
        let options = JobOptions {
            language: self.language.take(),
            ..JobOptions::default()
        };
        let stages = self.stages();
        let options = match job::accept_options(&self.app, options, &stages) {
            Ok(options) => options,
            Err(e) => return Ok(Err(e.to_string())),
        };
        // A client that hangs up while its audio decodes stops the decode (the decoder child is
        // killed when the upload's future is dropped).
        let upload = PreparedJob::from_upload(&self.app, dir, Source::File(path), options, stages);
        let prepared = tokio::select! {
            prepared = upload => match prepared {
                Ok(prepared) => prepared,
                Err(e @ AudioError::ShuttingDown) => {
                    self.error("shutting_down", &e.to_string()).await?;
                    return Ok(Ok(()));
                }
                Err(e) => return Ok(Err(e.to_string())),
            },
            () = hung_up(&mut self.reader) => return Ok(Ok(())),
        };
        let mut events = match job::start_job(Arc::clone(&self.app), prepared) {
            Ok(events) => events,
            Err(full) => {
                let message = format!(
                    "the GPU queue is full ({} waiting); retry in about {} s",
                    full.max_queue, full.retry_after_s
                );
                self.error("queue_full", &message).await?;
                return Ok(Ok(()));
            }
        };
        // Wait for the final event; a client that hangs up meanwhile cancels the job (the
        // receiver is dropped on return).
        let last = loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(e @ (ClientEvent::Result { .. } | ClientEvent::Error { .. })) => break Some(e),
                    Some(_) => {}
                    None => break None,
                },
                () = hung_up(&mut self.reader) => return Ok(Ok(())),
            }
        };
        match last {
            Some(ClientEvent::Result { result }) => {
                let transcript = Transcript::from_result(&result).unwrap_or_default();
                let mut data = json!({"text": transcript.text.trim()});
                if let Some(language) = transcript.language {
                    data["language"] = language.into();
                }
                write_event(&mut self.writer, "transcript", data).await?;
            }
            Some(ClientEvent::Error { code, message }) => {
                self.error(code.as_str(), &message).await?;
            }
            _ => {
                self.error("internal", "the job ended without a result")
                    .await?
            }
        }
        Ok(Ok(()))
    }
}

/// Completes when the client hangs up while its job runs. What it sent early (its next request)
/// stays unread in the buffer; past that, the socket itself is watched for the hangup. Pending
/// for good when even more is waiting in the socket (a client that keeps talking is there).
async fn hung_up(reader: &mut BufReader<OwnedReadHalf>) {
    match reader.fill_buf().await {
        Ok([]) | Err(_) => return,
        Ok(_) => {}
    }
    let mut one = [0u8; 1];
    match reader.get_mut().peek(&mut one).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}
