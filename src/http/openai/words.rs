//! The words of a `verbose_json` answer as OpenAI writes them: no punctuation around a word
//! (`"pipeline"`, not the transcript's `"pipeline."`), none that is punctuation alone.

/// The marks Whisper writes next to words: sentence punctuation, dashes, ellipsis, double
/// quotes, inverted marks, CJK, Arabic and Devanagari marks, brackets. Not symbols that are part
/// of what is said (`$`, `%`, `&`, `+`) nor the apostrophe (`'em`, `dogs'`).
const MARKS: &[char] = &[
    '.', ',', '!', '?', ';', ':', '"', '(', ')', '[', ']', '{', '}', '-', '–', '—', '…', '“', '”',
    '„', '«', '»', '‹', '›', '¿', '¡', '。', '，', '、', '！', '？', '：', '；', '「', '」', '『',
    '』', '（', '）', '《', '》', '・', '؟', '،', '؛', '।', '॥', '۔',
];

fn is_mark(c: char) -> bool {
    MARKS.contains(&c)
}

/// `word` without the punctuation before and after it; `None` when nothing but punctuation and
/// apostrophes is left. What belongs to the word stays: marks inside it (`o'clock`, `3.5`,
/// `well-known`), a sign or point before a digit (`-5`, `.5`), an abbreviation's last dot
/// (`U.S.`, `e.g.`).
pub(super) fn bare(word: &str) -> Option<&str> {
    let mut rest = word.trim();
    while let Some(c) = rest.chars().next().filter(|c| is_mark(*c)) {
        let after = &rest[c.len_utf8()..];
        if matches!(c, '-' | '.') && after.starts_with(|d: char| d.is_ascii_digit()) {
            break;
        }
        rest = after;
    }
    let mut end = rest.len();
    while let Some(c) = rest[..end].chars().next_back().filter(|c| is_mark(*c)) {
        let before = &rest[..end - c.len_utf8()];
        if c == '.' && abbreviation(before) {
            break;
        }
        end -= c.len_utf8();
    }
    let bare = &rest[..end];
    (!bare.chars().all(|c| c == '\'')).then_some(bare)
}

/// Whether `text` followed by a dot is an abbreviation: letters with dots between them
/// (`U.S`, `e.g`, `Ph.D`).
fn abbreviation(text: &str) -> bool {
    text.contains('.')
        && !text.ends_with('.')
        && text.chars().all(|c| c == '.' || c.is_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::bare;

    #[test]
    fn punctuation_around_a_word_goes_and_what_belongs_to_it_stays() {
        for (word, want) in [
            ("pipeline.", Some("pipeline")),
            ("\"Hello,", Some("Hello")),
            ("o'clock", Some("o'clock")),
            ("3.5%,", Some("3.5%")),
            ("$1,200.", Some("$1,200")),
            ("-5", Some("-5")),
            ("-0.5%.", Some("-0.5%")),
            (".5", Some(".5")),
            ("3-", Some("3")),
            ("U.S.", Some("U.S.")),
            ("e.g.,", Some("e.g.")),
            ("end.", Some("end")),
            ("'em", Some("'em")),
            ("well-known,", Some("well-known")),
            ("¿Qué?", Some("Qué")),
            ("„Hallo“", Some("Hallo")),
            ("你好。", Some("你好")),
            ("مرحبا؟", Some("مرحبا")),
            ("—", None),
            ("...", None),
            ("'", None),
        ] {
            assert_eq!(bare(word), want, "{word}");
        }
    }
}
