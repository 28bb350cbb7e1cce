//! The transcript's unit tests: speakers by overlap, segmenting, aligner words and their
//! `aligned` mark, joined words, times kept inside the recording.

use super::*;
use serde_json::json;

fn w(word: &str, start: f64, end: f64) -> Value {
    json!({"word": word, "start": start, "end": end, "probability": 0.9})
}

#[test]
fn overlapped_speech_is_carried_into_the_transcript() {
    let stages = json!({
        "diarizer": {
            "turns": [
                {"start": 0.0, "end": 2.5, "speaker": "SPEAKER_00"},
                {"start": 2.0, "end": 4.0, "speaker": "SPEAKER_01"}
            ],
            "overlaps": [[2.0, 2.5]]
        },
        "asr": {"segments": [{"start": 0.0, "end": 4.0, "text": "a b",
            "words": [w("a", 0.5, 1.0), w("b", 3.0, 3.5)]}]}
    });
    let out = build(stages.as_object().unwrap()).unwrap();
    assert_eq!(out.overlaps, vec![[2.0, 2.5]]);
    assert_eq!(out.turns.len(), 2);
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["overlaps"], json!([[2.0, 2.5]]));
    // Without overlap information the field stays out of the result.
    let plain = json!({"asr": {"segments": []}});
    let out = serde_json::to_value(build(plain.as_object().unwrap()).unwrap()).unwrap();
    assert!(out.get("overlaps").is_none(), "{out}");
}

#[test]
fn a_word_inside_two_turns_stays_with_the_speaker_of_the_word_before() {
    // A real call: SPEAKER_01's short interjection lies inside SPEAKER_00's turn, and "an"
    // lies inside both. It went to the turn listed last, cutting the sentence in three.
    let stages = json!({
        "diarizer": {"turns": [
            {"start": 10.105, "end": 12.67, "speaker": "SPEAKER_00"},
            {"start": 11.017, "end": 11.354, "speaker": "SPEAKER_01"}
        ]},
        "asr": {"segments": [{"start": 10.2, "end": 12.5, "text": "He was not an old man.",
            "words": [w("He", 10.2, 10.4), w("was", 10.45, 10.7), w("not", 10.75, 11.0),
                      w("an", 11.04, 11.23), w("old", 11.4, 11.8), w("man.", 11.9, 12.5)]}]}
    });
    let out = build(stages.as_object().unwrap()).unwrap();
    assert_eq!(out.segments.len(), 1, "{:?}", out.segments);
    assert_eq!(out.segments[0].speaker.as_deref(), Some("SPEAKER_00"));
    // The first word of a recording inside two turns goes to the longer one.
    let first = json!({
        "diarizer": {"turns": [
            {"start": 0.0, "end": 0.5, "speaker": "SPEAKER_01"},
            {"start": 0.0, "end": 3.0, "speaker": "SPEAKER_00"},
            {"start": 0.1, "end": 0.4, "speaker": "SPEAKER_02"}
        ]},
        "asr": {"segments": [{"start": 0.1, "end": 0.3, "text": "Hi.",
            "words": [w("Hi.", 0.15, 0.3)]}]}
    });
    let out = build(first.as_object().unwrap()).unwrap();
    assert_eq!(out.segments[0].speaker.as_deref(), Some("SPEAKER_00"));
}

#[test]
fn words_get_speakers_by_overlap_and_split_at_changes() {
    let stages = json!({
        "diarizer": {"turns": [
            {"start": 0.0, "end": 2.1, "speaker": "SPEAKER_00"},
            {"start": 2.3, "end": 4.0, "speaker": "SPEAKER_01"}
        ]},
        "asr": {"language": "en", "segments": [
            {"start": 0.0, "end": 4.0, "text": "hello there general kenobi",
             "words": [w("Hello", 0.1, 0.5), w("there.", 0.6, 2.2), w("General", 2.4, 3.0), w("Kenobi", 3.1, 4.5)]}
        ]}
    });
    let out = build(stages.as_object().unwrap()).unwrap();
    let segs = &out.segments;
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].text, "Hello there.");
    assert_eq!(segs[0].speaker.as_deref(), Some("SPEAKER_00"));
    assert_eq!(segs[1].text, "General Kenobi");
    assert_eq!(
        segs[1].words[1].speaker.as_deref(),
        Some("SPEAKER_01"),
        "past the last turn: nearest"
    );
    assert_eq!(out.speakers, ["SPEAKER_00", "SPEAKER_01"]);
    assert_eq!(out.language.as_deref(), Some("en"));
    assert_eq!(out.text, "Hello there. General Kenobi");
    let round = Transcript::from_result(&serde_json::to_value(&out).unwrap()).unwrap();
    assert_eq!(
        round, out,
        "the result's JSON reads back as the same transcript"
    );
}

#[test]
fn aligner_words_win_and_long_pauses_split() {
    let stages = json!({
        "asr": {"segments": [{"words": [w("a", 0.0, 0.2), w("b", 0.3, 0.5)]}]},
        "aligner": {"segments": [{"words": [
            {"word": "a", "start": 0.05, "end": 0.15, "score": 0.8},
            {"word": "b", "start": 1.5, "end": 1.7, "score": 0.7}
        ]}]}
    });
    let out = build(stages.as_object().unwrap()).unwrap();
    let segs = &out.segments;
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].words[0].start, 0.05);
    assert_eq!(segs[1].words[0].score, 0.7);
    assert!(segs[0].speaker.is_none());
}

#[test]
fn each_word_says_whether_the_aligner_placed_it() {
    let stages = json!({
        "asr": {"segments": [{"words": [w("a", 0.0, 0.2), w("b", 0.3, 0.5)]}]},
        "aligner": {"segments": [{"words": [
            {"word": "a", "start": 0.05, "end": 0.15, "score": 0.8, "aligned": true},
            {"word": "b", "start": 0.3, "end": 0.5, "score": 0.0, "aligned": false}
        ]}]}
    });
    let out = serde_json::to_value(build(stages.as_object().unwrap()).unwrap()).unwrap();
    let words = &out["segments"][0]["words"];
    assert_eq!(
        (&words[0]["aligned"], &words[1]["aligned"]),
        (&json!(true), &json!(false))
    );
    // Without an aligner the field stays out.
    let asr_only = json!({"asr": {"segments": [{"words": [w("a", 0.0, 0.2)]}]}});
    let out = serde_json::to_value(build(asr_only.as_object().unwrap()).unwrap()).unwrap();
    assert!(
        out["segments"][0]["words"][0].get("aligned").is_none(),
        "{out}"
    );
}

#[test]
fn words_written_on_to_the_one_before_are_joined_without_a_space() {
    let joined = |word: &str, start: f64| json!({"word": word, "start": start, "end": start + 0.2, "probability": 0.9, "joined": true});
    let stages = json!({"asr": {"language": "fr", "segments": [{"words": [
        w("Vous", 0.0, 0.2), w("n", 0.3, 0.4), joined("'êtes", 0.4),
        w("pas", 0.7, 0.9), w("ill", 1.0, 1.2), joined("-disposed.", 1.2),
        // Across a long pause it still stays with its word.
        w("Hello", 1.5, 1.7), joined("-there", 3.5)
    ]}]}});
    let out = build(stages.as_object().unwrap()).unwrap();
    assert_eq!(out.segments.len(), 1, "{:?}", out.segments);
    assert_eq!(out.text, "Vous n'êtes pas ill-disposed. Hello-there");
    // Chinese: every word joined, yet segments still end at pauses, and the text has no
    // space where they do.
    let stages = json!({"asr": {"language": "zh", "segments": [{"words": [
        w("我们", 0.0, 0.4), joined("今天", 0.4), joined("去", 0.8),
        joined("公园。", 3.0), joined("好", 3.3)
    ]}]}});
    let out = build(stages.as_object().unwrap()).unwrap();
    assert_eq!(out.segments.len(), 2, "{:?}", out.segments);
    assert_eq!(out.segments[0].text, "我们今天去");
    assert_eq!(out.text, "我们今天去公园。好");
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["segments"][0]["words"][2]["joined"], true);
    assert!(json["segments"][0]["words"][0].get("joined").is_none());
}

#[test]
fn no_asr_no_transcript() {
    assert!(build(json!({"w": {}}).as_object().unwrap()).is_none());
}

#[test]
fn times_past_the_recordings_end_are_kept_inside_it() {
    let stages = json!({
        "diarizer": {"turns": [
            {"start": 0.0, "end": 2.5, "speaker": "SPEAKER_00"},
            {"start": 2.6, "end": 3.0, "speaker": "SPEAKER_01"}
        ], "overlaps": [[2.2, 2.4], [2.7, 2.9]]},
        "asr": {"segments": [{"start": -0.1, "end": 2.9, "text": "hi there", "words": [
            {"word": "hi", "start": -0.1, "end": 0.4},
            {"word": "there", "start": 1.8, "end": 2.9}
        ]}]}
    });
    let mut out = build(stages.as_object().unwrap()).unwrap();
    out.clamp_to(2.5);
    let words: Vec<(f64, f64)> = out
        .segments
        .iter()
        .flat_map(|s| &s.words)
        .map(|w| (w.start, w.end))
        .collect();
    assert_eq!(words, [(0.0, 0.4), (1.8, 2.5)]);
    let last = out.segments.last().unwrap();
    assert_eq!((out.segments[0].start, last.end), (0.0, 2.5));
    assert_eq!(out.turns.len(), 1, "a turn wholly past the end goes");
    assert_eq!(out.overlaps, [[2.2, 2.4]]);
}

#[test]
fn a_korean_segment_is_cut_by_its_width_not_its_bytes() {
    // Ten words of three syllables: 89 bytes with the spaces (over the 84), 69 columns.
    let words: Vec<Value> = (0..10)
        .map(|i| w("예산을", 0.2 * f64::from(i), 0.2 * f64::from(i) + 0.15))
        .collect();
    let stages =
        json!({"asr": {"segments": [{"start": 0.0, "end": 2.0, "text": "", "words": words}]}});
    let out = build(stages.as_object().unwrap()).unwrap();
    assert_eq!(out.segments.len(), 1, "{:?}", out.segments);
}

#[test]
fn whole_words_join_the_pieces_of_a_written_word() {
    let stages = json!({"asr": {"segments": [{"start": 0.0, "end": 2.0, "text": "", "words": [
        w("three", 0.0, 0.4),
        w("o", 0.5, 0.6),
        {"word": "'clock.", "start": 0.6, "end": 1.0, "joined": true},
        w("你", 1.2, 1.4),
        {"word": "好", "start": 1.4, "end": 1.6, "joined": true}
    ]}]}});
    let out = build(stages.as_object().unwrap()).unwrap();
    let words: Vec<(String, f64, f64)> = out
        .whole_words()
        .into_iter()
        .map(|w| (w.word, w.start, w.end))
        .collect();
    assert_eq!(
        words,
        [
            ("three".into(), 0.0, 0.4),
            ("o'clock.".into(), 0.5, 1.0),
            ("你".into(), 1.2, 1.4),
            ("好".into(), 1.4, 1.6)
        ]
    );
}

#[test]
fn a_diarizers_own_result_is_kept_inside_the_recording_too() {
    let mut diarizer = json!({
        "turns": [
            {"start": -0.0, "end": 1.0, "speaker": "A", "score": 0.9},
            {"start": 2.0, "end": 1e300, "speaker": "B"},
            {"start": 5.0, "end": 6.0, "speaker": "C"}
        ],
        "overlaps": [[0.5, 0.8], [4.0, 4.5]],
        "engine": "overlap"
    });
    clamp_diarizer(&mut diarizer, 3.0);
    assert_eq!(
        diarizer,
        json!({
            "turns": [
                {"start": 0.0, "end": 1.0, "speaker": "A", "score": 0.9},
                {"start": 2.0, "end": 3.0, "speaker": "B"}
            ],
            "overlaps": [[0.5, 0.8]],
            "engine": "overlap"
        })
    );
}

#[test]
fn the_asrs_warnings_reach_the_transcript_bounded() {
    let stages = json!({"asr": {"language": "en", "segments": [],
        "warnings": ["this may not be English", 7, "x".repeat(5000)]}});
    let out = build(stages.as_object().unwrap()).unwrap();
    assert_eq!(out.warnings.len(), 2);
    assert_eq!(out.warnings[0], "this may not be English");
    assert!(out.warnings[1].ends_with("(4000 characters left out)"));
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["warnings"][0], "this may not be English");
    // An aligner without a model for the language says so there too.
    let skipped = json!({"asr": {"language": "de", "segments": []},
        "aligner": {"segments": [], "skipped": "pocketsphinx en-us has no model for language 'de'"}});
    let out = build(skipped.as_object().unwrap()).unwrap();
    assert_eq!(
        out.warnings,
        ["pocketsphinx en-us has no model for language 'de'"]
    );
    // None: the field stays out of the result.
    let plain = json!({"asr": {"segments": []}});
    let out = serde_json::to_value(build(plain.as_object().unwrap()).unwrap()).unwrap();
    assert!(out.get("warnings").is_none(), "{out}");
}
