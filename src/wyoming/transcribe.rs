//! `audio-stop`: the received audio becomes a job in the GPU queue, and its final event becomes
//! the connection's `transcript` or `error`. A client that hangs up meanwhile (a half-close
//! counts: Wyoming clients keep the connection open until their transcript) cancels the job.

use std::sync::Arc;

use serde_json::json;

use super::{Audio, Connection, ConnectionError, Refusal};
use crate::audio::{AudioError, Source};
use crate::job::{self, PreparedJob};
use crate::protocol::{ClientEvent, JobOptions};
use crate::transcript::Transcript;

impl Connection {
    /// `audio-stop`: runs the job and answers `transcript` or `error`.
    pub(super) async fn transcribe(&mut self) -> Result<Result<(), Refusal>, ConnectionError> {
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
        // The writer's buffer holds the last 8 KiB: a full disk may show only here.
        if let Err(e) = writer.finalize() {
            return Ok(Err(Refusal::not_stored(e)));
        }
        let options = JobOptions {
            language: self.language.take(),
            ..JobOptions::default()
        };
        let stages = self.stages();
        let options = match job::accept_options(&self.app, options, &stages) {
            Ok(options) => options,
            Err(e) => return Ok(Err(e.to_string().into())),
        };
        // A client that hangs up while its audio decodes stops the decode (the decoder child is
        // killed when the upload's future is dropped).
        let upload = PreparedJob::from_upload(&self.app, dir, Source::File(path), options, stages);
        let prepared = tokio::select! {
            prepared = upload => match prepared {
                Ok(prepared) => prepared,
                Err(e @ AudioError::ShuttingDown) => {
                    return Err(self.error("shutting_down", &e.to_string()).await);
                }
                Err(AudioError::NoSpace(e)) => return Ok(Err(Refusal::no_space(&e))),
                // The server's trouble (as HTTP's 500), not the audio's.
                Err(AudioError::Io(e)) => return Ok(Err(Refusal::io("normalize the audio", &e))),
                Err(e) => return Ok(Err(e.to_string().into())),
            },
            () = self.reader.get_mut().hung_up() => return Ok(Ok(())),
        };
        let mut events = match job::start_job(Arc::clone(&self.app), prepared) {
            Ok(events) => events,
            Err(full) => {
                let message = format!(
                    "the GPU queue is full ({} waiting); retry in about {} s",
                    full.max_queue, full.retry_after_s
                );
                return Err(self.error("queue_full", &message).await);
            }
        };
        // Wait for the final event; a client that hangs up meanwhile cancels the job (the
        // receiver is dropped on return), and the host's stop is answered at once.
        let stopping = self.app.stopping.clone();
        let last = loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(e @ (ClientEvent::Result { .. } | ClientEvent::Error { .. })) => break Some(e),
                    Some(_) => {}
                    None => break None,
                },
                () = self.reader.get_mut().hung_up() => return Ok(Ok(())),
                () = stopping.cancelled() => {
                    return Err(self.error("shutting_down", super::SHUTTING_DOWN).await);
                }
            }
        };
        match last {
            Some(ClientEvent::Result { result }) => match Transcript::from_result(&result) {
                Some(transcript) => {
                    let mut data = json!({"text": transcript.text.trim()});
                    if let Some(language) = transcript.language {
                        data["language"] = language.into();
                    }
                    self.send("transcript", data).await?;
                    Ok(Ok(()))
                }
                None => Err(self
                    .error("internal", "the job's result holds no transcript")
                    .await),
            },
            Some(ClientEvent::Error { code, message }) => {
                Err(self.error(code.as_str(), &message).await)
            }
            _ => Err(self
                .error("internal", "the job ended without a result")
                .await),
        }
    }
}
