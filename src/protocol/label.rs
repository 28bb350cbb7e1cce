//! What a label people give may hold (a voice's name, a lease's holder and purpose): text that
//! shows as it reads, with no control characters and none of the invisible ones that make two
//! labels look alike or turn a terminal or a page around.

/// A control character, or an invisible one that hides or reorders text: every format
/// character (zero-width space, direction marks, bidirectional embeddings, overrides and
/// isolates, word joiner and the invisible operators, byte-order mark, soft hyphen, the Arabic
/// and Egyptian format signs, tags), the line and paragraph separators, the combining grapheme
/// joiner, the Mongolian selectors and vowel separator, the Khmer inherent vowels, and the
/// letters that draw nothing (Hangul fillers, the blank Braille pattern), so that a name of them
/// looks blank. The zero-width joiner and non-joiner (U+200C, U+200D) pass: Persian, Indic
/// scripts and emoji sequences need them. Variation selectors are judged in context
/// ([`shows_as_text`]).
pub fn invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08E2}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'..='\u{17B5}'
                | '\u{180E}'
                | '\u{200B}'
                | '\u{200E}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{2800}'
                | '\u{3164}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF0}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{110CD}'
                | '\u{13430}'..='\u{1343F}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D159}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E00FF}'
                | '\u{E01F0}'..='\u{E0FFF}'
        )
}

/// A variation selector: it draws nothing and picks a glyph of the character before it.
fn variation_selector(c: char) -> bool {
    matches!(
        c,
        '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}' | '\u{180B}'..='\u{180D}' | '\u{180F}'
    )
}

/// Whether `selector` picks a glyph of `base`, as people write it: the emoji or text look of a
/// symbol (`❤️`), an ideographic variant of a CJK ideograph (Japanese names), a Mongolian letter's
/// positional form. After anything else it hides (`Bob\u{FE0F}` looks like `Bob`).
fn selects(base: char, selector: char) -> bool {
    match selector {
        '\u{FE0E}' | '\u{FE0F}' => emoji_base(base),
        '\u{E0100}'..='\u{E01EF}' => matches!(
            base,
            '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}' | '\u{20000}'..='\u{3FFFF}'
        ),
        '\u{180B}'..='\u{180D}' | '\u{180F}' => matches!(base, '\u{1820}'..='\u{18AF}'),
        _ => false,
    }
}

/// A character that has a text and an emoji look, which U+FE0E and U+FE0F choose between:
/// symbols, arrows, dingbats and emoji, and the keycap bases (`1️⃣`).
fn emoji_base(c: char) -> bool {
    matches!(
        c,
        '0'..='9'
            | '#'
            | '*'
            | '\u{00A9}'
            | '\u{00AE}'
            | '\u{2000}'..='\u{2BFF}'
            | '\u{3030}'
            | '\u{303D}'
            | '\u{3297}'
            | '\u{3299}'
            | '\u{1F000}'..='\u{1FAFF}'
    )
}

/// Whether `label` shows as it reads: no `invisible` character, no combining mark with nothing
/// to sit on (at the start, after a space or a joiner: `\u{301}` or ` \u{20DD}` looks blank), and a
/// variation selector only as the emoji or text look of a character that has both (`❤️`); after
/// a letter it hides (`Bob\u{FE0F}` looks like `Bob`).
pub fn shows_as_text(label: &str) -> bool {
    let mut before: Option<char> = None;
    for c in label.chars() {
        if invisible(c) {
            return false;
        }
        // A mark sits on the character before it: at the start, after a space or a joiner it
        // sits on nothing that shows.
        if unicode_normalization::char::is_combining_mark(c)
            && before.is_none_or(|b| b.is_whitespace() || matches!(b, '\u{200C}' | '\u{200D}'))
        {
            return false;
        }
        if variation_selector(c) && !before.is_some_and(|base| selects(base, c)) {
            return false;
        }
        before = Some(c);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_any_script_pass_and_hidden_characters_do_not() {
        assert!(shows_as_text("민수 (지하 서버) — nightly"));
        assert!(shows_as_text("می\u{200c}خواهم 👩\u{200d}🔬"));
        assert!(shows_as_text("Dana ❤\u{fe0f} 1\u{fe0f}\u{20e3}"));
        // An ideographic variant (葛 as written in a Japanese family name), a Mongolian form.
        assert!(shows_as_text("\u{845b}\u{e0100}城"));
        assert!(shows_as_text("\u{1820}\u{180b}"));
        // Marks on a letter: Korean jamo as typed, an accent, Hindi.
        assert!(shows_as_text(
            "e\u{301}lise \u{1100}\u{1161} \u{0939}\u{093f}\u{0928}\u{094d}\u{0926}\u{0940}"
        ));
        for bad in [
            "iso\u{2067}late",
            "a\u{1b}]0;x\u{7}",
            "bob\u{202e}",
            "zero\u{200b}width",
            "tab\there",
            "a\u{ad}b",
            "\u{3164}",
            "Bob\u{fe0f}",
            "Bob\u{e0041}",
            "Bo\u{2028}b",
            "\u{2800}",
            "a\u{2066}b",
            "\u{fe0f}",
            "Bob\u{e0100}",
            "Bob\u{180b}",
            "\u{301}",
            "\u{301}\u{301}",
            "\u{20dd}",
            "\u{1d159}",
            " \u{301}",
            "\u{200c}\u{20dd}",
            "a \u{301}b",
        ] {
            assert!(!shows_as_text(bad), "{bad:?}");
        }
    }
}
