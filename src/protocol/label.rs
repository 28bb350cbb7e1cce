//! What a label people give may hold (a voice's name, a lease's holder and purpose): text that
//! shows as it reads, with no control characters and none of the invisible ones that make two
//! labels look alike or turn a terminal or a page around.

/// A control character, or an invisible one that hides or reorders text: zero-width space,
/// direction marks, bidirectional embeddings, overrides and isolates, word joiner and the
/// invisible operators, byte-order mark, soft hyphen, combining grapheme joiner, Mongolian vowel
/// separator, and the Hangul fillers (letters that draw nothing, so a name of them looks blank).
/// The zero-width joiner and non-joiner (U+200C, U+200D) pass: Persian, Indic scripts and emoji
/// sequences need them.
pub fn invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{180E}'
                | '\u{200B}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{3164}'
                | '\u{FEFF}'
                | '\u{FFA0}'
        )
}

/// Whether `label` shows as it reads (no `invisible` character).
pub fn shows_as_text(label: &str) -> bool {
    !label.chars().any(invisible)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_any_script_pass_and_hidden_characters_do_not() {
        assert!(shows_as_text("민수 (지하 서버) — nightly"));
        assert!(shows_as_text("می\u{200c}خواهم 👩\u{200d}🔬"));
        for bad in [
            "iso\u{2067}late",
            "a\u{1b}]0;x\u{7}",
            "bob\u{202e}",
            "zero\u{200b}width",
            "tab\there",
            "a\u{ad}b",
            "\u{3164}",
        ] {
            assert!(!shows_as_text(bad), "{bad:?}");
        }
    }
}
