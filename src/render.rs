//! Renders a job result for people and tools: `json` and `txt` (speech formats join in `transcript`).

use serde_json::Value;

/// Output formats of `?format=` and `gpuhost transcribe --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Json,
    Txt,
}

/// Renders `result` (the `result` of the final event) in `format`.
pub fn render(result: &Value, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(result).unwrap_or_default() + "\n",
        Format::Txt => text(result),
    }
}

fn text(result: &Value) -> String {
    let Some(segments) = result.get("segments").and_then(Value::as_array) else {
        // No transcript: show each stage's result.
        return serde_json::to_string_pretty(result.get("stages").unwrap_or(result))
            .unwrap_or_default()
            + "\n";
    };
    let mut out = String::new();
    let mut last_speaker = None;
    for seg in segments {
        let speaker = seg.get("speaker").and_then(Value::as_str);
        let text = seg.get("text").and_then(Value::as_str).unwrap_or("").trim();
        if speaker.is_some() && speaker != last_speaker {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!("{}: ", speaker.unwrap_or_default()));
        } else if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(text);
        last_speaker = speaker;
    }
    out.push('\n');
    out
}
