//! Transcript edits made after the merge for its readers: times kept inside the recording, and
//! whole words for clients that put spaces between words.

use super::{continues, Transcript, Word};

impl Transcript {
    /// Every word, the pieces of one written word joined into it ("o" + "'clock." →
    /// "o'clock.", spanning both): what a client that puts spaces between words expects, as
    /// OpenAI's `words` are. Words of Chinese or Japanese stay apart, as they are there.
    pub fn whole_words(&self) -> Vec<Word> {
        let mut out: Vec<Word> = Vec::new();
        for w in self.segments.iter().flat_map(|s| &s.words) {
            match out.last_mut() {
                Some(last) if continues(w) => {
                    last.word.push_str(&w.word);
                    last.end = last.end.max(w.end);
                }
                _ => out.push(Word {
                    joined: false,
                    ..w.clone()
                }),
            }
        }
        out
    }

    /// Keeps every time inside the recording, `0..=duration`: a worker's times past its end (a
    /// model's padded window, a worker's bug) would make cues and RTTM turns no player shows
    /// and no scorer reads. A turn or overlap left empty is dropped.
    pub fn clamp_to(&mut self, duration: f64) {
        // (`+ 0.0` makes a `-0.0` plain 0.)
        let within = |t: f64| t.clamp(0.0, duration.max(0.0)) + 0.0;
        for seg in &mut self.segments {
            (seg.start, seg.end) = (within(seg.start), within(seg.end));
            for w in &mut seg.words {
                (w.start, w.end) = (within(w.start), within(w.end));
            }
        }
        for t in &mut self.turns {
            (t.start, t.end) = (within(t.start), within(t.end));
        }
        self.turns.retain(|t| t.end > t.start);
        for o in &mut self.overlaps {
            *o = [within(o[0]), within(o[1])];
        }
        self.overlaps.retain(|o| o[1] > o[0]);
    }
}

/// A diarizer's own result (a pipeline without an ASR: its turns are what `?format=rttm` and the
/// JSON give) kept inside the recording as [`Transcript::clamp_to`] keeps a transcript: its
/// turns' and overlaps' times, in place, other fields as they were; a span left empty dropped.
pub fn clamp_diarizer(diarizer: &mut serde_json::Value, duration: f64) {
    let within = |t: f64| t.clamp(0.0, duration.max(0.0)) + 0.0;
    if let Some(turns) = diarizer.get_mut("turns").and_then(|t| t.as_array_mut()) {
        for turn in turns.iter_mut() {
            for key in ["start", "end"] {
                if let Some(t) = turn.get(key).and_then(serde_json::Value::as_f64) {
                    turn[key] = within(t).into();
                }
            }
        }
        turns.retain(|t| t["end"].as_f64() > t["start"].as_f64());
    }
    if let Some(spans) = diarizer.get_mut("overlaps").and_then(|o| o.as_array_mut()) {
        for span in spans.iter_mut() {
            if let Some([a, b]) = span.as_array_mut().map(|s| s.as_mut_slice()) {
                for t in [a, b] {
                    if let Some(v) = t.as_f64() {
                        *t = within(v).into();
                    }
                }
            }
        }
        spans.retain(|s| s[1].as_f64() > s[0].as_f64());
    }
}
