//! Which of the stages ready at once a run tries first: the ASR when the request names a
//! language or asks for a translation, since its worker may refuse those (an English-only
//! model), and a refusal should come before the other stages have spent their time.

use crate::protocol::JobOptions;

/// The stage whose worker says which languages it knows (the name every door uses for the
/// request's `language`, `prompt` and `translate`).
const ASR: &str = "asr";

/// The indices of `stages` in the order a run looks at them. Only matters where stages of one
/// parallel group cannot run beside each other (oneshot workers run one at a time): resident
/// ones start together whatever the order.
pub(super) fn first_to_refuse(stages: &[String], options: &JobOptions) -> Vec<usize> {
    let mut order: Vec<usize> = (0..stages.len()).collect();
    if options.language.is_some() || options.translate {
        if let Some(asr) = stages.iter().position(|s| s == ASR) {
            order.remove(asr);
            order.insert(0, asr);
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stages() -> Vec<String> {
        ["diarizer", "asr", "aligner"].map(String::from).to_vec()
    }

    #[test]
    fn the_asr_goes_first_only_for_a_language_or_a_translation() {
        let plain = JobOptions::default();
        assert_eq!(first_to_refuse(&stages(), &plain), [0, 1, 2]);
        let korean = JobOptions {
            language: Some("ko".into()),
            ..JobOptions::default()
        };
        assert_eq!(first_to_refuse(&stages(), &korean), [1, 0, 2]);
        let translate = JobOptions {
            translate: true,
            ..JobOptions::default()
        };
        assert_eq!(first_to_refuse(&stages(), &translate), [1, 0, 2]);
        let no_asr = ["diarizer".to_string()];
        assert_eq!(first_to_refuse(&no_asr, &korean), [0]);
    }
}
