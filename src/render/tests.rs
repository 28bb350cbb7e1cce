//! Rendering's unit tests: every format from sample results, and what a worker writes kept from forging cues or columns.

use super::*;
use serde_json::json;

fn sample() -> Value {
    json!({
        "segments": [
            {"start": 0.5, "end": 2.25, "speaker": "SPEAKER_00", "text": "Hello there.", "words": []},
            {"start": 3661.0, "end": 3662.5, "speaker": "SPEAKER_01", "text": "Hi.", "words": []}
        ],
        "turns": [{"start": 0.4, "end": 2.3, "speaker": "SPEAKER_00"}]
    })
}

#[test]
fn srt_cues_show_markup_as_text() {
    assert_eq!(srt_escape("[Al<i>ce] a < b"), "[Al<\u{200B}i>ce] a < b");
    assert_eq!(
        srt_escape("</b> {\\an8} {x}"),
        "<\u{200B}/b> {\u{200B}\\an8} {x}"
    );
    assert_eq!(srt_escape("plain 안녕"), "plain 안녕");
}

#[test]
fn srt_and_vtt_cues() {
    let srt = render(&sample(), Format::Srt);
    assert!(
        srt.starts_with(
            "1\n00:00:00,500 --> 00:00:02,250\n[SPEAKER_00] Hello there.\n\n2\n01:01:01,000"
        ),
        "{srt}"
    );
    let vtt = render(&sample(), Format::Vtt);
    assert!(
        vtt.starts_with("WEBVTT\n\n00:00:00.500 --> 00:00:02.250\n<v SPEAKER_00>Hello there.\n"),
        "{vtt}"
    );
}

#[test]
fn what_a_worker_writes_cannot_forge_cues_or_shift_columns() {
    let forged = "hi\n\n2\n00:00:00,000 --> 00:00:09,000\nX";
    let result = json!({
        "segments": [
            {"start": 0.5, "end": 2.0, "speaker": forged, "text": forged, "words": []},
            {"start": 3.0, "end": 4.0, "speaker": " \n ", "text": "plain", "words": []}
        ],
        "turns": [
            {"start": -5.0, "end": 1.0, "speaker": ""},
            {"start": 1.0, "end": 2.0, "speaker": "a\tb\nc"}
        ]
    });
    let srt = render(&result, Format::Srt);
    assert_eq!(srt.matches("-->").count(), 2, "{srt}");
    assert_eq!(
        srt.split("\n\n").filter(|c| !c.is_empty()).count(),
        2,
        "{srt}"
    );
    assert!(
        srt.contains("\n[hi 2 00:00:00,000 -> 00:00:09,000 X] hi"),
        "{srt}"
    );
    assert!(
        srt.ends_with("00:00:04,000\nplain\n\n"),
        "a blank speaker is none: {srt}"
    );
    let vtt = render(&result, Format::Vtt);
    assert_eq!(vtt.matches("-->").count(), 2, "{vtt}");
    let rttm = render(&result, Format::Rttm);
    for line in rttm.lines() {
        assert_eq!(line.split(' ').count(), 10, "{line}");
    }
    assert!(
        rttm.starts_with("SPEAKER audio 1 0.000 1.000 <NA> <NA> <NA>"),
        "{rttm}"
    );
    assert!(rttm.contains(" a_b_c "), "{rttm}");
    let txt = render(&result, Format::Txt);
    assert_eq!(txt.lines().count(), 1, "no line breaks but its own: {txt}");
}

#[test]
fn txt_and_rttm() {
    assert_eq!(
        render(&sample(), Format::Txt),
        "SPEAKER_00: Hello there.\nSPEAKER_01: Hi.\n"
    );
    assert_eq!(
        render(&sample(), Format::Rttm),
        "SPEAKER audio 1 0.400 1.900 <NA> <NA> SPEAKER_00 <NA> <NA>\n"
    );
    // A recording's name, one field (the RTTM of several files put together stays scorable).
    assert_eq!(
        super::render_named(&sample(), Format::Rttm, "team meeting\t3"),
        "SPEAKER team_meeting_3 1 0.400 1.900 <NA> <NA> SPEAKER_00 <NA> <NA>\n"
    );
    assert!(super::render_named(&sample(), Format::Rttm, "").starts_with("SPEAKER audio 1"));
}

#[test]
fn enrolled_names_keep_the_formats_intact() {
    let named = json!({
        "segments": [{"start": 0.0, "end": 1.0, "speaker": "Kim <R&D>", "text": "a < b", "words": []}],
        "turns": [{"start": 0.0, "end": 1.0, "speaker": "김 민수"}]
    });
    let vtt = render(&named, Format::Vtt);
    assert!(vtt.contains("<v Kim &lt;R&amp;D&gt;>a &lt; b\n"), "{vtt}");
    assert!(render(&named, Format::Rttm).contains(" 김_민수 <NA>"));
}

#[test]
fn every_cue_has_text_and_a_length() {
    let result = json!({
        "segments": [
            {"start": 1.0, "end": 1.0, "text": "Yes.", "words": []},
            {"start": 2.0, "end": 2.5, "text": "\u{7}", "words": []},
            {"start": 3.0, "end": 3.5, "text": "a-->b", "words": []}
        ],
        "turns": [{"start": -0.0, "end": 0.5, "speaker": "A"}]
    });
    let srt = render(&result, Format::Srt);
    assert_eq!(
        srt,
        "1\n00:00:01,000 --> 00:00:01,100\nYes.\n\n2\n00:00:03,000 --> 00:00:03,500\na->b\n\n"
    );
    // Lengthened, a cue stops at the next one and at the recording's end.
    let tight = json!({
        "duration": 2.05,
        "segments": [
            {"start": 1.0, "end": 1.0, "text": "One.", "words": []},
            {"start": 1.04, "end": 1.04, "text": "Two.", "words": []},
            {"start": 2.0, "end": 2.0, "text": "Three.", "words": []}
        ]
    });
    let srt = render(&tight, Format::Srt);
    assert!(srt.contains("00:00:01,000 --> 00:00:01,040\nOne."), "{srt}");
    assert!(srt.contains("00:00:01,040 --> 00:00:01,140\nTwo."), "{srt}");
    assert!(
        srt.contains("00:00:02,000 --> 00:00:02,050\nThree."),
        "{srt}"
    );
    // A segment of no length that starts with the next (the aligner put "yeah, yeah, yeah." at
    // one instant of a real meeting): its tenth of a second beside the next, not 5,570 --> 5,570.
    // One of no length at the recording's very end ends there.
    let together = json!({
        "duration": 9.0,
        "segments": [
            {"start": 5.57, "end": 5.57, "text": "yeah, yeah, yeah.", "words": []},
            {"start": 5.57, "end": 7.2, "text": "So the remote.", "words": []},
            {"start": 9.0, "end": 9.0, "text": "Bye.", "words": []}
        ]
    });
    for format in [Format::Srt, Format::Vtt] {
        let cues = render(&together, format).replace('.', ",");
        assert!(cues.contains("00:00:05,570 --> 00:00:05,670\n"), "{cues}");
        assert!(cues.contains("00:00:05,570 --> 00:00:07,200\n"), "{cues}");
        assert!(cues.contains("00:00:08,900 --> 00:00:09,000\n"), "{cues}");
    }
    // WebVTT's escape keeps the text as it was.
    let vtt = render(&result, Format::Vtt);
    assert!(vtt.ends_with("00:00:03.500\na--&gt;b\n\n"), "{vtt}");
    assert!(render(&result, Format::Rttm).starts_with("SPEAKER audio 1 0.000 0.500 "));
}
