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
