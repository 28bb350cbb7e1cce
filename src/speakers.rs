//! Enrolled voices: the voiceprints kept in `<state_dir>/speakers/`, one file per voice (owner
//! read/write only: a voiceprint is personal data), read once at startup and changed only through
//! `/speakers`. A voice is the samples it was enrolled from; what the diarizer matches is their
//! mean. Deleting a voice removes its file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

/// Longest name, in bytes (a file name holds it twice over in hex).
pub const NAME_MAX: usize = 100;
/// Length of a voiceprint.
pub const DIM: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpeakerError {
    #[error("{0}")]
    BadName(String),
    #[error("no enrolled voice is named `{0}`")]
    NotFound(String),
    #[error("no enrolled voice is named `{0}`; should an enrolment of that name be under way, it is refused when it ends")]
    NotYet(String),
    #[error("{max} voices are enrolled already ([speakers] max_voices); delete some first")]
    Full { max: usize },
    #[error("`{name}` was enrolled with the model {had}, and this sample comes from {got}; delete `{name}` and enrol it again")]
    OtherModel {
        name: String,
        had: String,
        got: String,
    },
    #[error("`{0}` was deleted while it was being enrolled; enrol it again if you meant to")]
    DeletedMeanwhile(String),
    #[error("the {stage} worker answered without a valid voiceprint: {why}")]
    BadVoiceprint { stage: String, why: String },
    #[error("the voices folder in the state folder could not be written ({0}); check its permissions and free space")]
    Io(String),
}

#[derive(Debug, Default)]
struct Inner {
    voices: BTreeMap<String, Voice>,
    /// Deletions so far, in all (the store's clock of deletions).
    deleted: u64,
    /// The value of `deleted` at each name's last deletion while enrolments were under way,
    /// known names or not (an enrolment's name is read with its upload): an enrolment that
    /// began before it must not bring the voice back when it ends. Emptied whenever no
    /// enrolment is under way, which is when nobody can ask any more.
    deletions: BTreeMap<String, u64>,
    /// Enrolments under way ([`Enrolment`]s alive).
    enrolling: usize,
    /// The value of `deleted` when `deletions` was full: every enrolment that began before it
    /// is refused (no name is forgotten, whatever number of names is deleted meanwhile).
    everyone: u64,
    /// Files an older build kept under another spelling of a name that could not join the voice
    /// of that name (another model), found at load: `DELETE` of the name removes them too.
    stranded: BTreeMap<String, Vec<PathBuf>>,
}

/// Most names `deletions` keeps; past it, every enrolment under way is refused.
const DELETIONS_MAX: usize = 10_000;

/// An enrolment under way, from its request's arrival until it is dropped (after
/// [`Speakers::add`], which it is passed to, even when the client has left meanwhile).
#[derive(Debug)]
pub struct Enrolment {
    inner: Arc<Mutex<Inner>>,
    /// The store's clock of deletions when it began.
    generation: u64,
}

impl Drop for Enrolment {
    fn drop(&mut self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.enrolling -= 1;
        if inner.enrolling == 0 {
            inner.deletions.clear();
            inner.everyone = 0;
        }
    }
}

#[derive(Debug)]
pub struct Speakers {
    dir: PathBuf,
    /// std Mutex: map reads and updates only, never across a file write or an `.await`, so
    /// listing voices and matching them in a job never wait on the disk.
    inner: Arc<Mutex<Inner>>,
    /// std Mutex: serializes the changes (`add`, `delete`) across their file write, so two
    /// changes of one voice cannot lose each other's sample. Those run on a blocking thread.
    writer: Mutex<()>,
}

/// Which temporary files [`Speakers::load`] removes (a crash's leftovers hold voiceprints too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftovers {
    /// Every one: the server, the only writer of its state folder.
    All,
    /// Those older than a write takes: a command running beside a server that may be writing.
    Stale,
}

impl Speakers {
    /// Reads every voice in `dir` (missing: none yet). A file that is unreadable or not a sound
    /// voice is skipped with a warning, never a reason not to start; temporary files a crash
    /// left mid-write are removed as `leftovers` says.
    pub fn load(dir: PathBuf, leftovers: Leftovers) -> Speakers {
        use std::os::unix::fs::PermissionsExt;
        if dir.is_dir() {
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        let mut inner = Inner::default();
        let mut old_names = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => Some(entries),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(path = %dir.display(), error = %e, "cannot read the enrolled voices: no speaker will be named after them");
                None
            }
        };
        for entry in entries.into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) {
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= STALE_TMP));
                if stale || leftovers == Leftovers::All {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            // Voiceprints are personal data: readable by the owner only, whatever an older
            // build or a copy left (regular files only: a link's target is not ours to change).
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
            }
            match read_voice(&path, &name) {
                Ok(voice) => {
                    inner.voices.insert(voice.name.clone(), voice);
                }
                Err(e) => match renamed(&path, &name) {
                    Some(voice) => old_names.push((path, voice)),
                    None => {
                        tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable voiceprint file")
                    }
                },
            }
        }
        let speakers = Speakers {
            dir,
            inner: Arc::new(Mutex::new(inner)),
            writer: Mutex::new(()),
        };
        // Only the server writes here: a one-shot command beside it reads the old spellings
        // under their names as written now and leaves the files to the server.
        speakers.rename_old(old_names, leftovers == Leftovers::All);
        speakers
    }

    /// Voices an older build kept under a name written otherwise than names are kept now
    /// (`Bob\u{A0}Smith`): kept under the name as it is written now (joining a voice of that
    /// name and model), the old file removed. Left as they were, they were neither listed nor
    /// deletable, and `DELETE` left personal data on disk. Samples the voice has already are
    /// not added again (a crash after the write and before the old file's removal migrates it
    /// twice). With `write` false (a one-shot command beside a server) in memory only.
    fn rename_old(&self, old: Vec<(PathBuf, Voice)>, write: bool) {
        for (path, voice) in old {
            let name = voice.name.clone();
            let joined = {
                let mut inner = self.lock();
                match inner.voices.get_mut(&voice.name) {
                    Some(known) if known.model != voice.model => None,
                    Some(known) => {
                        for sample in voice.samples {
                            let had = known
                                .samples
                                .iter()
                                .any(|k| k.added == sample.added && k.vector == sample.vector);
                            if !had {
                                known.samples.push(sample);
                            }
                        }
                        Some(known.clone())
                    }
                    None => {
                        inner.voices.insert(voice.name.clone(), voice.clone());
                        Some(voice)
                    }
                }
            };
            let Some(joined) = joined else {
                tracing::warn!(path = %path.display(), "a voiceprint file kept under an older spelling of a name enrolled with another model; left as it is (DELETE of the name removes it too)");
                self.lock().stranded.entry(name).or_default().push(path);
                continue;
            };
            if !write {
                continue;
            }
            let _guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            match self.write(&joined) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                    synced(&self.dir);
                    tracing::info!(name = %joined.name, "a voice kept under an older spelling of its name is kept under this one now");
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot keep a voice under its name as written now")
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn list(&self) -> Vec<Value> {
        self.lock().voices.values().map(Voice::summary).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().voices.is_empty()
    }

    /// What a diarization task carries: `[{name, model, vector}]` of every voice made by
    /// `model` (every voice when the worker's model is not known yet: the worker leaves out
    /// those of another model itself).
    pub fn prints(&self, model: Option<&str>) -> Vec<Value> {
        self.lock()
            .voices
            .values()
            .filter(|v| model.is_none_or(|m| m == v.model))
            .map(|v| json!({ "name": v.name, "model": v.model, "vector": v.print() }))
            .collect()
    }

    /// Taken when an enrolment request comes in (before its body, which names the voice, is
    /// read) and given back to `add`: a deletion of that name in between wins.
    /// An enrolment begins: a deletion of its name from now on (of any name: the name comes
    /// with the upload) makes [`Speakers::add`] refuse its sample.
    pub fn enrolment(&self) -> Enrolment {
        let mut inner = self.lock();
        inner.enrolling += 1;
        Enrolment {
            inner: Arc::clone(&self.inner),
            generation: inner.deleted,
        }
    }

    /// Whether a sample for `name` could be kept now (checked before the GPU does the work).
    pub fn check_room(&self, name: &str, max_voices: usize) -> Result<(), SpeakerError> {
        let inner = self.lock();
        if !inner.voices.contains_key(name) && inner.voices.len() >= max_voices {
            return Err(SpeakerError::Full { max: max_voices });
        }
        Ok(())
    }

    /// Adds a sample to the voice `name` (creating it), keeping at most `max_samples`. Writes a
    /// file (fsync included): call it off the async runtime (`spawn_blocking`).
    pub fn add(
        &self,
        name: &str,
        model: &str,
        sample: Sample,
        enrolment: &Enrolment,
        limits: (usize, usize),
    ) -> Result<Value, SpeakerError> {
        let (max_voices, max_samples) = limits;
        let _writing = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut voice = {
            let inner = self.lock();
            let deleted_at = inner.deletions.get(name).copied().max(Some(inner.everyone));
            if deleted_at.is_some_and(|at| at > enrolment.generation) {
                return Err(SpeakerError::DeletedMeanwhile(name.into()));
            }
            match inner.voices.get(name) {
                Some(v) if v.model != model => {
                    return Err(SpeakerError::OtherModel {
                        name: name.into(),
                        had: v.model.clone(),
                        got: model.into(),
                    })
                }
                Some(v) => v.clone(),
                None if inner.voices.len() >= max_voices => {
                    return Err(SpeakerError::Full { max: max_voices })
                }
                None => Voice {
                    name: name.into(),
                    model: model.into(),
                    samples: Vec::new(),
                },
            }
        };
        voice.samples.push(sample);
        let excess = voice.samples.len().saturating_sub(max_samples);
        voice.samples.drain(..excess);
        // The file first, outside the map's lock: readers see the voice once it is on disk.
        self.write(&voice)
            .map_err(|e| SpeakerError::Io(io_kind(&e)))?;
        let summary = voice.summary();
        self.lock().voices.insert(name.into(), voice);
        Ok(summary)
    }

    /// Forgets `name` and removes its file, for good (the folder is synced). A file of that
    /// name that could not be read at startup (cut short, damaged) is removed too: deleting a
    /// voice must not leave its voiceprint on disk. Touches the disk: call it off the async
    /// runtime.
    pub fn delete(&self, name: &str) -> Result<(), SpeakerError> {
        let _writing = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let known = self.lock().voices.contains_key(name);
        if !known && name.len() > NAME_MAX {
            // No voice can have it, and its file name would be too long to ask about.
            return Err(SpeakerError::NotFound(name.into()));
        }
        let found = match std::fs::remove_file(self.file(name)) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => known,
            Err(e) => return Err(SpeakerError::Io(io_kind(&e))),
        };
        // A file an older build kept under another spelling of this name that could not join
        // it (another model): the name's personal data too.
        let stranded = self.lock().stranded.remove(name).unwrap_or_default();
        let found = stranded.iter().fold(found, |found, path| {
            std::fs::remove_file(path).is_ok() || found
        });
        // What a crash left mid-write may hold this voice's print: none is a write in
        // progress (this server's writes wait for `writer`, and nothing else writes here).
        let swept = self.remove_leftovers();
        if found || swept {
            synced(&self.dir);
        }
        let mut inner = self.lock();
        inner.voices.remove(name);
        inner.deleted += 1;
        let at = inner.deleted;
        if inner.enrolling > 0 {
            // Maybe its (first) enrolment is under way: it must not store what was withdrawn.
            if inner.deletions.len() < DELETIONS_MAX || inner.deletions.contains_key(name) {
                inner.deletions.insert(name.into(), at);
            } else {
                inner.everyone = at;
            }
        }
        match (found, inner.enrolling) {
            (true, _) => Ok(()),
            (false, 0) => Err(SpeakerError::NotFound(name.into())),
            (false, _) => Err(SpeakerError::NotYet(name.into())),
        }
    }

    /// Removes every temporary file in the folder; whether there was one.
    fn remove_leftovers(&self) -> bool {
        let mut any = false;
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                any |= std::fs::remove_file(entry.path()).is_ok();
            }
        }
        any
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(file_name(name))
    }

    /// Writes the voice's file whole (temporary file, then rename), readable by its owner only.
    fn write(&self, voice: &Voice) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if !self.dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)?;
            // The new folder's entry in its parent survives a power cut too.
            if let Some(parent) = self.dir.parent() {
                synced(parent);
            }
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempfile_in(&self.dir)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        tmp.write_all(&serde_json::to_vec(voice).map_err(std::io::Error::other)?)?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.file(&voice.name)).map_err(|e| e.error)?;
        synced(&self.dir);
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Makes a rename or removal in `dir` survive a power cut. The change itself is made by then:
/// a failed sync is logged, not an error (memory and disk would disagree about it otherwise).
fn synced(dir: &Path) {
    if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot sync the voices folder");
    }
}

/// What went wrong on disk, without the server path tempfile puts in its errors (clients see
/// this message; docs/security.md: errors never name server paths).
fn io_kind(e: &std::io::Error) -> String {
    e.kind().to_string()
}

/// Age from which a temporary file is a crash's leftover, not a write in progress.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(600);

/// Files a write in progress goes to first.
const TMP_PREFIX: &str = ".voice-";

/// `<name in hex>.json`: any name, Korean included, is a safe file name.
fn file_name(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.json")
}

/// The voice in the file `name` at `path`, when it is one the API could have made.
/// The most a voice file may hold (one is about 6 KB: a 256-number vector and a few fields).
const VOICE_MAX: u64 = 1 << 20;

/// The voice in the file `name` at `path` under its name as written now, when the file is that
/// voice's under an older spelling (a name an older build kept unnormalized) and sound otherwise.
fn renamed(path: &Path, name: &str) -> Option<Voice> {
    let bytes = crate::files::read_regular(path, VOICE_MAX).ok()?;
    let mut voice: Voice = serde_json::from_slice(&bytes).ok()?;
    if file_name(&voice.name) != name {
        return None;
    }
    let now = check_name(&voice.name).ok()?;
    if now == voice.name {
        return None;
    }
    voice.name = now;
    sound(&voice).ok()?;
    Some(voice)
}

fn read_voice(path: &Path, name: &str) -> Result<Voice, String> {
    let bytes = crate::files::read_regular(path, VOICE_MAX).map_err(|e| e.to_string())?;
    let voice: Voice = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    sound(&voice)?;
    if file_name(&voice.name) != name {
        return Err(format!("it holds `{}`, whose file this is not", voice.name));
    }
    Ok(voice)
}

mod voice;

use voice::sound;
pub use voice::{check_name, normal_name, sample_of, Sample, Voice};

#[cfg(test)]
mod tests;
