//! Text cut to a bounded length for messages and views, saying how much was left out: a
//! worker's dump, a command line of megabytes, a 64 KiB stderr line.

/// `text`, its first `max` characters and how many more there were.
pub fn cut(text: String, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text;
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept} … ({} characters left out)", count - max)
}

/// `text`, its middle left out past `max` characters: the start says what it is, the end how
/// it ended.
pub fn cut_middle(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let half = max / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(count - half).collect();
    format!(
        "{head} … ({} characters left out) … {tail}",
        count - 2 * half
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_text_is_cut_by_characters_and_says_how_much_went() {
        assert_eq!(super::cut("short".into(), 10), "short");
        assert_eq!(
            super::cut("é".repeat(12), 10),
            format!("{} … (2 characters left out)", "é".repeat(10))
        );
        assert_eq!(
            super::cut_middle("abcdefghij", 4),
            "ab … (6 characters left out) … ij"
        );
        assert_eq!(super::cut_middle("abc", 4), "abc");
    }
}
