//! The shape a stage's result must have for the transcript to be built from it, checked as the
//! worker answers: a malformed result (`segments` a string, a word without times) is that
//! worker's bad output (502), not a successful empty transcript.

use serde_json::Value;

/// Why `result`, the answer of the stage `stage`, cannot make a transcript (`None`: it can, or
/// the stage is none the transcript reads). Names the field at fault.
pub fn fault(stage: &str, result: &Value) -> Option<String> {
    match stage {
        "asr" => segments(result, true).err(),
        "aligner" => segments(result, false).err(),
        "diarizer" => diarization(result).err(),
        _ => None,
    }
}

fn segments(result: &Value, required: bool) -> Result<(), String> {
    let Some(segments) = result.get("segments") else {
        return match required {
            true => Err("its result has no `segments`".into()),
            false => Ok(()),
        };
    };
    let segments = segments
        .as_array()
        .ok_or("its result's `segments` is not a list")?;
    for (i, segment) in segments.iter().enumerate() {
        let at = format!("segments[{i}]");
        if !segment.is_object() {
            return Err(format!("its result's `{at}` is not an object"));
        }
        let Some(words) = segment.get("words") else {
            // Text the host cannot place is text the transcript would lose without a word.
            let text = segment.get("text").and_then(Value::as_str).unwrap_or("");
            if text.trim().is_empty() {
                continue;
            }
            return Err(format!("its result's `{at}` has text but no `words`"));
        };
        let words = words
            .as_array()
            .ok_or_else(|| format!("its result's `{at}.words` is not a list"))?;
        for (j, word) in words.iter().enumerate() {
            let at = format!("{at}.words[{j}]");
            if !word.get("word").is_some_and(Value::is_string) {
                return Err(format!("its result's `{at}.word` is not a string"));
            }
            for key in ["start", "end"] {
                times(word, key, &at)?;
            }
            for key in ["score", "probability"] {
                if word.get(key).is_some_and(|v| !v.is_number()) {
                    return Err(format!("its result's `{at}.{key}` is not a number"));
                }
            }
        }
    }
    Ok(())
}

fn diarization(result: &Value) -> Result<(), String> {
    if let Some(turns) = result.get("turns") {
        let turns = turns
            .as_array()
            .ok_or("its result's `turns` is not a list")?;
        for (i, turn) in turns.iter().enumerate() {
            let at = format!("turns[{i}]");
            if !turn.get("speaker").is_some_and(Value::is_string) {
                return Err(format!("its result's `{at}.speaker` is not a string"));
            }
            for key in ["start", "end"] {
                times(turn, key, &at)?;
            }
        }
    }
    if let Some(overlaps) = result.get("overlaps") {
        serde_json::from_value::<Vec<[f64; 2]>>(overlaps.clone())
            .map_err(|e| format!("its result's `overlaps` is not a list of [start, end]: {e}"))?;
    }
    if let Some(identities) = result.get("identities") {
        serde_json::from_value::<Vec<super::Identity>>(identities.clone())
            .map_err(|e| format!("its result's `identities` are not as documented: {e}"))?;
    }
    Ok(())
}

/// `object[key]` is a time: a finite number of seconds, not negative.
fn times(object: &Value, key: &str, at: &str) -> Result<(), String> {
    match object.get(key).and_then(Value::as_f64) {
        Some(t) if t.is_finite() && t >= 0.0 => Ok(()),
        _ => Err(format!(
            "its result's `{at}.{key}` is not a time (seconds, 0 or more)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_the_transcript_cannot_use_is_named_by_its_field() {
        let word = json!({"word": "hi", "start": 0.1, "end": 0.3, "probability": 0.9});
        let good = json!({"segments": [{"text": "hi", "words": [word]}], "language": "en"});
        assert_eq!(fault("asr", &good), None);
        assert_eq!(fault("aligner", &json!({})), None, "an aligner may pass");
        assert_eq!(fault("original", &json!("anything")), None);
        for (result, says) in [
            (json!({}), "no `segments`"),
            (json!({"segments": "str"}), "`segments` is not a list"),
            (
                json!({"segments": [1, 2]}),
                "`segments[0]` is not an object",
            ),
            (
                json!({"segments": [{"text": "hi"}]}),
                "has text but no `words`",
            ),
            (
                json!({"segments": [{"words": "nope"}]}),
                "`segments[0].words` is not a list",
            ),
            (
                json!({"segments": [{"words": [{"word": "a", "start": "a", "end": 1}]}]}),
                "`segments[0].words[0].start` is not a time",
            ),
            (
                json!({"segments": [{"words": [{"word": 7, "start": 0, "end": 1}]}]}),
                "`segments[0].words[0].word` is not a string",
            ),
            (
                json!({"segments": [{"words": [{"word": "a", "start": -1, "end": 1}]}]}),
                "is not a time",
            ),
            (
                json!({"segments": [{"words": [{"word": "a", "start": 0, "end": 1, "score": "x"}]}]}),
                "`segments[0].words[0].score` is not a number",
            ),
        ] {
            let fault = fault("asr", &result).unwrap_or_default();
            assert!(fault.contains(says), "{result}: {fault}");
        }
        assert_eq!(
            fault(
                "diarizer",
                &json!({"model": "m", "vector": [0.1], "seconds": 3})
            ),
            None,
            "an enrolment"
        );
        assert_eq!(
            fault(
                "diarizer",
                &json!({"turns": [{"speaker": "SPEAKER_00", "start": 0, "end": 1}], "overlaps": [[0.2, 0.4]]})
            ),
            None
        );
        for (result, says) in [
            (json!({"turns": {}}), "`turns` is not a list"),
            (
                json!({"turns": [{"speaker": 0, "start": 0, "end": 1}]}),
                "`turns[0].speaker`",
            ),
            (
                json!({"turns": [{"speaker": "A", "start": 0}]}),
                "`turns[0].end` is not a time",
            ),
            (json!({"overlaps": [[1]]}), "`overlaps`"),
            (json!({"identities": [{"speaker": 1}]}), "`identities`"),
        ] {
            let fault = fault("diarizer", &result).unwrap_or_default();
            assert!(fault.contains(says), "{result}: {fault}");
        }
    }
}
