//! A job's request options (`language`, speakers, `prompt`, `translate`): one type and one check for every
//! door a job comes in by (query string, OpenAI form, Wyoming, CLI).

use serde::{Deserialize, Serialize};

/// Per-request options handed to every stage, checked by [`JobOptions::validated`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobOptions {
    /// Language code (`en`, `ko`); absent: the ASR detects it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_speakers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_speakers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_speakers: Option<u32>,
    /// Text that primes the ASR (names, spelling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Translate the speech to English instead of transcribing it (`/v1/audio/translations`;
    /// needs a multilingual ASR model).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub translate: bool,
}

/// Why request options were refused (400, or 413 for an over-long prompt).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionsError {
    #[error("`{option}`: speaker counts must be at least 1")]
    ZeroSpeakers { option: &'static str },
    #[error("`{option}`: speaker counts must be at most {MAX_SPEAKERS}")]
    TooManySpeakers { option: &'static str },
    #[error("min_speakers ({min}) is above max_speakers ({max})")]
    MinAboveMax { min: u32, max: u32 },
    #[error("num_speakers ({num}) is outside min_speakers..max_speakers ({min}..{max})")]
    NumOutsideRange { num: u32, min: u32, max: u32 },
    #[error("`language` must be a language code (two or three letters) such as `en`, `ko`, `yue` or `en-US` (the region is dropped), or a language's English name such as `korean`")]
    BadLanguage,
    #[error("`prompt` is longer than {max} bytes (limits.max_field_bytes)")]
    PromptTooLong { max: usize },
    #[error("{}", unsupported_language(.language, .stage, .model, .known))]
    UnsupportedLanguage {
        language: String,
        stage: String,
        model: String,
        known: Vec<String>,
    },
    #[error("`{option}` is for the `{stage}` stage, which this request does not run: add `{stage}` to `stages`, or leave `{option}` out")]
    StageNotRun { option: &'static str, stage: String },
    #[error("`{option}` is for a `{stage}` stage, and the configured pipeline has none: leave `{option}` out")]
    NoSuchStage { option: &'static str, stage: String },
    #[error(
        "translation to English needs a multilingual model, and the `{stage}` worker's {model} \
         is English-only: give it one (`engine = \"base\"` under [workers.{stage}] on CPU, or \
         `engine = \"cuda\"` with any multilingual Whisper model)"
    )]
    CannotTranslate { stage: String, model: String },
}

/// Why `language` is refused, and what would help: another model when the worker's knows one
/// language (English-only), another code when it knows many (a multilingual model already).
fn unsupported_language(language: &str, stage: &str, model: &str, known: &[String]) -> String {
    if known.len() > 1 {
        return format!(
            "language `{language}` is not one the `{stage}` worker's {model} knows. Leave \
             `language` out to have it detected, or give one of: {}",
            known.join(", ")
        );
    }
    if super::language::name(language).is_none() {
        // No model would help: a typo, or a code of a language no engine here knows.
        return format!(
            "language `{language}` is not a language code any engine here knows (Whisper's \
             100 languages, by ISO 639 code such as `ko` or `kor`, or English name such as `korean`); \
             the `{stage}` worker's {model} knows {}. Leave `language` out, or fix it",
            known.join(", ")
        );
    }
    format!(
        "language `{language}` is not supported by the `{stage}` worker: {model} knows {} only. \
         Leave `language` out, or give the `{stage}` worker a multilingual model (for the asr \
         worker: `engine = \"base\"` under [workers.asr] on CPU, or `engine = \"cuda\"` with any \
         Whisper model)",
        known.join(", ")
    )
}

/// Longest `language` accepted (codes are 2–3 letters, names a few more).
const LANGUAGE_MAX: usize = 64;

/// The most speakers a request may name (a clustering asked for 2^31 overflowed in the worker).
const MAX_SPEAKERS: u32 = 1000;

impl JobOptions {
    /// The one check of request options, whichever door they came in by (query string, OpenAI
    /// form, CLI flags): empty strings mean "not given", counts must make sense, text is bounded.
    pub fn validated(mut self, max_prompt_bytes: usize) -> Result<JobOptions, OptionsError> {
        self.language = self
            .language
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty());
        self.prompt = self.prompt.filter(|p| !p.trim().is_empty());
        if let Some(l) = &self.language {
            if l.len() > LANGUAGE_MAX {
                return Err(OptionsError::BadLanguage);
            }
            // The code engines take: `EN`, `en-US` and `English` are `en`; an ISO 639 code is
            // two or three ASCII letters (`12`, `x-klingon` and `klingon` are none, and no bidi
            // override or zero-width character reaches results and logs).
            let code = super::language::code(l).ok_or(OptionsError::BadLanguage)?;
            let letters =
                (2..=3).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_lowercase());
            if !letters {
                return Err(OptionsError::BadLanguage);
            }
            self.language = Some(code);
        }
        if self
            .prompt
            .as_ref()
            .is_some_and(|p| p.len() > max_prompt_bytes)
        {
            return Err(OptionsError::PromptTooLong {
                max: max_prompt_bytes,
            });
        }
        let counts = [
            ("num_speakers", self.num_speakers),
            ("min_speakers", self.min_speakers),
            ("max_speakers", self.max_speakers),
        ];
        for (option, count) in counts {
            match count {
                Some(0) => return Err(OptionsError::ZeroSpeakers { option }),
                Some(n) if n > MAX_SPEAKERS => {
                    return Err(OptionsError::TooManySpeakers { option })
                }
                _ => {}
            }
        }
        if let (Some(min), Some(max)) = (self.min_speakers, self.max_speakers) {
            if min > max {
                return Err(OptionsError::MinAboveMax { min, max });
            }
        }
        if let Some(num) = self.num_speakers {
            let (min, max) = (
                self.min_speakers.unwrap_or(1),
                self.max_speakers.unwrap_or(MAX_SPEAKERS),
            );
            if num < min || num > max {
                return Err(OptionsError::NumOutsideRange { num, min, max });
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_language_gets_the_advice_that_fits_the_model() {
        let refuse_as = |language: &str, known: &[&str]| {
            OptionsError::UnsupportedLanguage {
                language: language.into(),
                stage: "asr".into(),
                model: "m".into(),
                known: known.iter().map(|k| k.to_string()).collect(),
            }
            .to_string()
        };
        let refuse = |known: &[&str]| refuse_as("ko", known);
        let english_only = refuse(&["en"]);
        assert!(english_only.contains("engine = \"base\""), "{english_only}");
        // No language at all: no model would help.
        let typo = refuse_as("xx", &["en"]);
        assert!(!typo.contains("engine ="), "{typo}");
        assert!(typo.contains("not a language code"), "{typo}");
        // A multilingual model already: another model would not help, another code would.
        let many = refuse(&["de", "en", "ko"]);
        assert!(!many.contains("engine ="), "{many}");
        assert!(
            many.contains("de, en, ko") && many.contains("detected"),
            "{many}"
        );
    }

    #[test]
    fn options_are_checked_in_one_place() {
        let ok = JobOptions {
            language: Some(" ko ".into()),
            prompt: Some("  ".into()),
            min_speakers: Some(2),
            max_speakers: Some(3),
            ..JobOptions::default()
        }
        .validated(10)
        .unwrap();
        assert_eq!(ok.language.as_deref(), Some("ko"));
        assert_eq!(ok.prompt, None, "blank means not given");
        let check = |o: JobOptions| o.validated(4).unwrap_err();
        let speakers = |num, min, max| JobOptions {
            num_speakers: num,
            min_speakers: min,
            max_speakers: max,
            ..JobOptions::default()
        };
        assert_eq!(
            check(speakers(Some(0), None, None)),
            OptionsError::ZeroSpeakers {
                option: "num_speakers"
            }
        );
        assert_eq!(
            check(speakers(None, Some(3), Some(2))),
            OptionsError::MinAboveMax { min: 3, max: 2 }
        );
        assert!(matches!(
            check(speakers(Some(5), None, Some(3))),
            OptionsError::NumOutsideRange { num: 5, .. }
        ));
        for (too_many, option) in [
            (speakers(Some(1 << 31), None, None), "num_speakers"),
            (speakers(None, Some(MAX_SPEAKERS + 1), None), "min_speakers"),
            (speakers(None, None, Some(u32::MAX)), "max_speakers"),
        ] {
            assert_eq!(check(too_many), OptionsError::TooManySpeakers { option });
        }
        for (given, code) in [
            ("EN", "en"),
            ("en-US", "en"),
            ("Korean", "ko"),
            ("zh_Hant", "zh"),
        ] {
            let language = JobOptions {
                language: Some(given.into()),
                ..JobOptions::default()
            };
            assert_eq!(
                language.validated(4).unwrap().language.as_deref(),
                Some(code)
            );
        }
        let prompt = JobOptions {
            prompt: Some("names".into()),
            ..JobOptions::default()
        };
        assert_eq!(check(prompt), OptionsError::PromptTooLong { max: 4 });
        for bad in [
            "e\u{7}n",
            "\u{202e}",
            "k\u{200b}o",
            "한국어",
            "en us",
            "-US",
            "12",
            "x-klingon",
            "klingon",
            "fake:sleep=1",
        ] {
            let language = JobOptions {
                language: Some(bad.into()),
                ..JobOptions::default()
            };
            assert_eq!(check(language), OptionsError::BadLanguage, "{bad:?}");
        }
    }
}
