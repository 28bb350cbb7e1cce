//! `[wyoming]`: the Wyoming (Home Assistant) speech-to-text server beside the HTTP one.

use std::net::SocketAddr;

use serde::Deserialize;

/// `[wyoming]`: a Wyoming protocol (Home Assistant) speech-to-text server beside the HTTP one.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WyomingConfig {
    /// Where to serve it (e.g. `"0.0.0.0:10300"`); absent: off. The protocol has no
    /// authentication, so bind it only where every client may transcribe.
    #[serde(deserialize_with = "super::validate::some_socket_addr")]
    pub listen: Option<SocketAddr>,
    /// Stages a Wyoming request runs, in pipeline order. Default: `asr` alone when the pipeline
    /// has it (a voice command wants its text fast), else the whole pipeline.
    pub stages: Option<Vec<String>>,
    /// Languages announced to Home Assistant. Default `["en"]`: the bundled CPU model is
    /// English-only; list a multilingual model's languages (`["en", "ko", …]`) when you use one.
    pub languages: Vec<String>,
}

impl Default for WyomingConfig {
    fn default() -> Self {
        WyomingConfig {
            listen: None,
            stages: None,
            languages: vec!["en".to_string()],
        }
    }
}

impl WyomingConfig {
    /// The stages a Wyoming request runs.
    pub fn stages(&self, pipeline: &[String]) -> Vec<String> {
        match &self.stages {
            Some(stages) => pipeline
                .iter()
                .filter(|s| stages.contains(s))
                .cloned()
                .collect(),
            None if pipeline.iter().any(|s| s == "asr") => vec!["asr".to_string()],
            None => pipeline.to_vec(),
        }
    }

    /// The languages announced are codes Home Assistant can offer (`en`, `ko`, `pt-BR`): at
    /// least one when the server is on, since an empty list leaves it nothing to pick.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.listen.is_some() && self.languages.is_empty() {
            return Err(
                "[wyoming] languages is empty: Home Assistant would have no language to offer; \
                 list the model's languages, e.g. [\"en\"]"
                    .into(),
            );
        }
        let code = |l: &String| {
            let mut parts = l.split(['-', '_']);
            let first = parts.next().unwrap_or_default();
            (2..=3).contains(&first.len())
                && first.chars().all(|c| c.is_ascii_alphabetic())
                && parts.all(|p| {
                    (1..=8).contains(&p.len()) && p.chars().all(|c| c.is_ascii_alphanumeric())
                })
        };
        if let Some(bad) = self.languages.iter().find(|l| !code(l)) {
            return Err(format!(
                "[wyoming] languages holds {bad:?}: each must be a language code such as \"en\", \"ko\" or \"pt-BR\""
            ));
        }
        Ok(())
    }
}
