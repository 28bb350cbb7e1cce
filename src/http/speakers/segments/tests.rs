//! Enrolment spans: given segments, a transcript's turns, their union and what overlaps take away.

use super::*;

#[test]
fn overlapped_speech_is_cut_out_of_the_turns() {
    let spans = [[0.0, 10.0], [12.0, 20.0]];
    let cuts = [
        [15.0, 16.0],
        [2.0, 3.0],
        [2.5, 4.0],
        [9.99, 12.5],
        [30.0, 31.0],
    ];
    assert_eq!(
        minus(&spans, &cuts),
        [[0.0, 2.0], [4.0, 9.99], [12.5, 15.0], [16.0, 20.0]]
    );
    // A cut over a whole span leaves nothing of it; slivers of 50 ms or less go too.
    assert_eq!(minus(&[[1.0, 2.0]], &[[0.0, 5.0]]), Vec::<[f64; 2]>::new());
    assert_eq!(minus(&[[1.0, 2.0]], &[[1.03, 2.0]]), Vec::<[f64; 2]>::new());
}

#[test]
fn a_diarizer_only_result_gives_its_stage_s_turns() {
    // `?stages=diarizer` has no top-level turns: they are under `stages.diarizer`.
    let event = serde_json::json!({"type": "result", "result": {"stages": {"diarizer": {
        "turns": [
            {"start": 0.0, "end": 4.0, "speaker": "SPEAKER_00"},
            {"start": 3.0, "end": 9.0, "speaker": "SPEAKER_01"},
        ],
        "overlaps": [[3.0, 4.0]],
    }}}})
    .to_string();
    assert_eq!(turns_of(&event, "SPEAKER_01").unwrap().0, [[4.0, 9.0]]);
    let err = turns_of(&event, "SPEAKER_07").unwrap_err();
    assert!(
        err.message
            .ends_with("its speakers are: SPEAKER_00, SPEAKER_01"),
        "{}",
        err.message
    );
}

#[test]
fn json_that_is_no_transcript_is_told_so() {
    // `{"a": 1}` said "its speakers are: " and nothing after it.
    let err = turns_of(r#"{"a": 1}"#, "SPEAKER_00").unwrap_err();
    assert!(
        err.message.contains("names no speaker") && err.message.contains("JSON `result`"),
        "{}",
        err.message
    );
}

#[test]
fn inverted_or_endless_overlaps_are_refused_not_multiplied() {
    // Each inverted cut used to double the parts: 40 of them would need terabytes.
    let overlaps = vec![[10.0, 0.0]; 40];
    let text = serde_json::json!({
        "turns": [{"start": 0.0, "end": 20.0, "speaker": "A"}],
        "overlaps": overlaps,
    })
    .to_string();
    let err = turns_of(&text, "A").unwrap_err();
    assert!(err.message.contains("start <= end"), "{}", err.message);
    let many = serde_json::json!({
        "turns": [{"start": 0.0, "end": 20.0, "speaker": "A"}],
        "overlaps": vec![[1.0, 2.0]; SEGMENTS_MAX + 1],
    })
    .to_string();
    assert!(turns_of(&many, "A").is_err());
}

#[test]
fn repeated_turns_are_one_stretch_of_time() {
    // 3 000 copies of one long turn across 100 000 overlaps: each copy used to be cut into
    // 100 000 parts (300 million, 4.8 GB, and the host aborted).
    let turns = vec![serde_json::json!({"start": 0.0, "end": 1e9, "speaker": "A"}); 3000];
    let overlaps: Vec<[f64; 2]> = (0..SEGMENTS_MAX)
        .map(|i| [2.0 * i as f64, 2.0 * i as f64 + 1.0])
        .collect();
    let text = serde_json::json!({"turns": turns, "overlaps": overlaps}).to_string();
    let (spans, _) = turns_of(&text, "A").unwrap();
    // The gaps between the overlaps, and the tail.
    assert_eq!(spans.len(), SEGMENTS_MAX);
    // Given as `segments`, repeats and overlaps are merged too.
    let given = segments_of(Some("[[0, 2], [1, 3], [0, 2], [5, 6]]"), None, None);
    assert_eq!(given.unwrap().spans, Some(vec![[0.0, 3.0], [5.0, 6.0]]));
}

#[test]
fn many_turns_and_overlaps_take_linear_time() {
    let turns: Vec<_> = (0..20_000)
        .map(|i| serde_json::json!({"start": i as f64, "end": i as f64 + 0.9, "speaker": "A"}))
        .collect();
    let overlaps: Vec<[f64; 2]> = (0..SEGMENTS_MAX)
        .map(|i| [i as f64 * 0.2, i as f64 * 0.2 + 0.1])
        .collect();
    let text = serde_json::json!({"turns": turns, "overlaps": overlaps}).to_string();
    // 20 000 × 100 000 pairs were 2·10⁹ steps; merged and sorted it is a few hundred thousand.
    let (spans, _) = turns_of(&text, "A").unwrap();
    assert!(spans
        .iter()
        .all(|[s, e]| e - s > 0.05 && e - s <= 0.1 + 1e-9));
}

#[test]
fn a_speaker_is_found_in_any_unicode_form_and_the_recordings_length_is_read() {
    // "보브" as macOS types it (NFD: jamo) against the transcript's NFC label.
    let text = serde_json::json!({"result": {"duration": 4.21, "turns": [
        {"start": 0.5, "end": 2.0, "speaker": "보브"}
    ]}})
    .to_string();
    let nfd = "\u{1107}\u{1169}\u{1107}\u{1173}";
    let given = segments_of(None, Some(&text), Some(nfd)).unwrap();
    assert_eq!(given.spans, Some(vec![[0.5, 2.0]]));
    assert_eq!(given.transcribed_s, Some(4.21));
}
