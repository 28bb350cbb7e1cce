//! The multipart form of the OpenAI endpoints: OpenAI's fields (the ones gpuhost has no use
//! for checked and ignored), gpuhost's speaker counts, and nothing else: a field given twice or
//! one nobody knows is a 400 that names it, as OpenAI answers it, never silently dropped.

use super::super::error::ApiError;
use super::super::upload;
use crate::audio::Source;

#[derive(Default)]
pub(super) struct Form {
    pub file: Option<Source>,
    pub language: Option<String>,
    pub prompt: Option<String>,
    pub response_format: Option<String>,
    pub granularities: Vec<String>,
    pub num_speakers: Option<u32>,
    pub min_speakers: Option<u32>,
    pub max_speakers: Option<u32>,
}

/// The fields read, for the message about one that is not.
const FIELDS: &str = "file, model, language, prompt, response_format, temperature, \
    timestamp_granularities[], stream (false), chunking_strategy, include[], and gpuhost's \
    num_speakers, min_speakers, max_speakers";

pub(super) async fn read_form(
    request: axum::extract::Request,
    dir: &std::path::Path,
    limit: u64,
    max_field: usize,
    keep_free: u64,
) -> Result<Form, ApiError> {
    let mut fields = upload::Form::open(request).await?;
    let mut form = Form::default();
    let mut given = upload::Given::default();
    while let Some(field) = fields.next().await? {
        let name = field.name().unwrap_or("").to_string();
        if name.is_empty() {
            return Err(ApiError::bad_request(
                "a form part has no name (or one that is not UTF-8): each part needs \
                 `Content-Disposition: form-data; name=\"…\"`",
            ));
        }
        if !(name.ends_with("[]") || name == "timestamp_granularities") {
            given.first(&name)?;
        }
        if name == "file" {
            form.file =
                Some(upload::collect_field(field, &dir.join("upload"), limit, keep_free).await?);
            continue;
        }
        // A field nobody reads is named as such, whatever its size (it read as a field too
        // long for limits.max_field_bytes).
        if !known(&name) {
            return Err(ApiError::bad_request(format!(
                "unknown form field `{}`; this endpoint reads {FIELDS}",
                shown(&name)
            ))
            .at(shown(&name)));
        }
        let value = upload::text_field(field, &name, max_field, "limits.max_field_bytes").await?;
        match name.as_str() {
            "language" => form.language = Some(value),
            "prompt" => form.prompt = Some(value),
            "response_format" => form.response_format = Some(value),
            "timestamp_granularities[]" | "timestamp_granularities" => {
                // Two values exist: kept once each, so repeats cannot pile up in memory.
                if !matches!(value.as_str(), "word" | "segment") {
                    return Err(ApiError::bad_request(format!(
                        "timestamp_granularities must be `word` or `segment`, got {:?}",
                        value.chars().take(40).collect::<String>()
                    ))
                    .at("timestamp_granularities[]"));
                }
                if !form.granularities.contains(&value) {
                    form.granularities.push(value);
                }
            }
            "num_speakers" => form.num_speakers = Some(count(&name, &value)?),
            "min_speakers" => form.min_speakers = Some(count(&name, &value)?),
            "max_speakers" => form.max_speakers = Some(count(&name, &value)?),
            "temperature" => {
                // Decoding is the server's (chosen on real recordings); a value is still checked.
                let t: Option<f64> = value.trim().parse().ok();
                if !t.is_some_and(|t| (0.0..=1.0).contains(&t)) {
                    return Err(ApiError::bad_request(format!(
                        "temperature must be a number from 0 to 1, got {:?} (the server chooses \
                         its own decoding; the value is checked, then ignored)",
                        value.chars().take(40).collect::<String>()
                    ))
                    .at("temperature"));
                }
            }
            // As form encoders write a bool: `false`, `False` (Python's `requests`), `0`.
            "stream" => match value.trim().to_ascii_lowercase().as_str() {
                "false" | "0" | "" => {}
                "true" | "1" => {
                    return Err(ApiError::bad_request(
                        "stream=true is not offered here: POST /transcribe streams the job's \
                         progress as NDJSON",
                    )
                    .at("stream"))
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "stream must be `true` or `false`, got {:?}",
                        other.chars().take(40).collect::<String>()
                    ))
                    .at("stream"))
                }
            },
            // Accepted and ignored, as clients send them: the server's pipeline decides. The
            // official client sends an object as `chunking_strategy[type]` and so on.
            _ => {} // `model`, `chunking_strategy…`, `include…`: see `known`
        }
    }
    Ok(form)
}

/// A form field given as a query parameter instead (`?language=ko`): OpenAI's endpoints read
/// the form only, so it would be dropped without a word (an English transcript for a Korean
/// request). Other query parameters (`api-version`, as Azure OpenAI clients add) pass.
pub(super) fn field_in_query(uri: &axum::http::Uri) -> Option<String> {
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri).ok()?;
    pairs
        .into_iter()
        .map(|(name, _)| name)
        .find(|name| name == "file" || known(name))
}

/// Whether the form reads a field of this name. `model`, `chunking_strategy` and `include`
/// are accepted and ignored, as clients send them: the server's pipeline decides (the official
/// client sends an object as `chunking_strategy[type]` and so on).
fn known(name: &str) -> bool {
    matches!(
        name,
        "language"
            | "prompt"
            | "response_format"
            | "timestamp_granularities[]"
            | "timestamp_granularities"
            | "num_speakers"
            | "min_speakers"
            | "max_speakers"
            | "temperature"
            | "stream"
            | "model"
            | "chunking_strategy"
            | "include[]"
            | "include"
    ) || name.starts_with("chunking_strategy[")
}

/// A field name as a message may show it: at most 40 characters.
fn shown(name: &str) -> String {
    name.chars().take(40).collect()
}

fn count(name: &str, value: &str) -> Result<u32, ApiError> {
    value.trim().parse().map_err(|_| {
        ApiError::bad_request(format!(
            "{name} must be a whole number from 1 to 1000, got {:?}",
            value.chars().take(40).collect::<String>()
        ))
        .at(name)
    })
}
