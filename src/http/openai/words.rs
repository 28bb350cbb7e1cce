//! The words of a `verbose_json` answer as OpenAI writes them: no punctuation around a word
//! (`"pipeline"`, not the transcript's `"pipeline."`), none that is punctuation alone.

/// The marks Whisper writes next to words: sentence punctuation, dashes, ellipsis, double
/// quotes, inverted marks, CJK full-width marks and brackets. Not symbols that are part of what
/// is said (`$`, `%`, `&`, `+`) nor the apostrophe (`'em`, `dogs'`).
const MARKS: &[char] = &[
    '.', ',', '!', '?', ';', ':', '"', '(', ')', '[', ']', '{', '}', '-', '–', '—', '…', '“', '”',
    '«', '»', '¿', '¡', '。', '，', '、', '！', '？', '：', '；', '「', '」', '『', '』', '（',
    '）', '《', '》', '・',
];

/// `word` without the punctuation before and after it (inside it stays: `o'clock`, `3.5`,
/// `well-known`); `None` when nothing else is left.
pub(super) fn bare(word: &str) -> Option<&str> {
    let bare = word.trim().trim_matches(|c| MARKS.contains(&c));
    (!bare.is_empty()).then_some(bare)
}

#[cfg(test)]
mod tests {
    use super::bare;

    #[test]
    fn punctuation_around_a_word_goes_and_inside_it_stays() {
        for (word, want) in [
            ("pipeline.", Some("pipeline")),
            ("\"Hello,", Some("Hello")),
            ("o'clock", Some("o'clock")),
            ("3.5%,", Some("3.5%")),
            ("$1,200.", Some("$1,200")),
            ("'em", Some("'em")),
            ("well-known,", Some("well-known")),
            ("¿Qué?", Some("Qué")),
            ("你好。", Some("你好")),
            ("—", None),
            ("...", None),
        ] {
            assert_eq!(bare(word), want, "{word}");
        }
    }
}
