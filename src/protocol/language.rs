//! Language codes: Whisper's 100 languages with their English names, and how a request's
//! `language` becomes the lowercase code every engine takes (`EN`, `en-US`, `en_us` and
//! `English` are `en`).

/// Whisper's languages, code and name, in its tokenizer's order (OpenAI's `verbose_json` names
/// the language by these names).
const LANGUAGES: &[(&str, &str)] = &[
    ("en", "english"),
    ("zh", "chinese"),
    ("de", "german"),
    ("es", "spanish"),
    ("ru", "russian"),
    ("ko", "korean"),
    ("fr", "french"),
    ("ja", "japanese"),
    ("pt", "portuguese"),
    ("tr", "turkish"),
    ("pl", "polish"),
    ("ca", "catalan"),
    ("nl", "dutch"),
    ("ar", "arabic"),
    ("sv", "swedish"),
    ("it", "italian"),
    ("id", "indonesian"),
    ("hi", "hindi"),
    ("fi", "finnish"),
    ("vi", "vietnamese"),
    ("he", "hebrew"),
    ("uk", "ukrainian"),
    ("el", "greek"),
    ("ms", "malay"),
    ("cs", "czech"),
    ("ro", "romanian"),
    ("da", "danish"),
    ("hu", "hungarian"),
    ("ta", "tamil"),
    ("no", "norwegian"),
    ("th", "thai"),
    ("ur", "urdu"),
    ("hr", "croatian"),
    ("bg", "bulgarian"),
    ("lt", "lithuanian"),
    ("la", "latin"),
    ("mi", "maori"),
    ("ml", "malayalam"),
    ("cy", "welsh"),
    ("sk", "slovak"),
    ("te", "telugu"),
    ("fa", "persian"),
    ("lv", "latvian"),
    ("bn", "bengali"),
    ("sr", "serbian"),
    ("az", "azerbaijani"),
    ("sl", "slovenian"),
    ("kn", "kannada"),
    ("et", "estonian"),
    ("mk", "macedonian"),
    ("br", "breton"),
    ("eu", "basque"),
    ("is", "icelandic"),
    ("hy", "armenian"),
    ("ne", "nepali"),
    ("mn", "mongolian"),
    ("bs", "bosnian"),
    ("kk", "kazakh"),
    ("sq", "albanian"),
    ("sw", "swahili"),
    ("gl", "galician"),
    ("mr", "marathi"),
    ("pa", "punjabi"),
    ("si", "sinhala"),
    ("km", "khmer"),
    ("sn", "shona"),
    ("yo", "yoruba"),
    ("so", "somali"),
    ("af", "afrikaans"),
    ("oc", "occitan"),
    ("ka", "georgian"),
    ("be", "belarusian"),
    ("tg", "tajik"),
    ("sd", "sindhi"),
    ("gu", "gujarati"),
    ("am", "amharic"),
    ("yi", "yiddish"),
    ("lo", "lao"),
    ("uz", "uzbek"),
    ("fo", "faroese"),
    ("ht", "haitian creole"),
    ("ps", "pashto"),
    ("tk", "turkmen"),
    ("nn", "nynorsk"),
    ("mt", "maltese"),
    ("sa", "sanskrit"),
    ("lb", "luxembourgish"),
    ("my", "myanmar"),
    ("bo", "tibetan"),
    ("tl", "tagalog"),
    ("mg", "malagasy"),
    ("as", "assamese"),
    ("tt", "tatar"),
    ("haw", "hawaiian"),
    ("ln", "lingala"),
    ("ha", "hausa"),
    ("ba", "bashkir"),
    ("jw", "javanese"),
    ("su", "sundanese"),
    ("yue", "cantonese"),
];

/// The English name of a Whisper language code (`ko` → `korean`).
pub fn name(code: &str) -> Option<&'static str> {
    LANGUAGES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// The code a request's `language` stands for: a language's English name (any case) is its
/// code, and otherwise the primary subtag, lowercased (`EN`, `en-US`, `zh_Hant` → `en`, `en`,
/// `zh`): engines take bare lowercase codes, and no engine here tells regions or scripts apart.
/// `None` when nothing is left (`-US`).
pub fn code(language: &str) -> Option<String> {
    let lower = language.trim().to_ascii_lowercase();
    if let Some((code, _)) = LANGUAGES.iter().find(|(_, n)| *n == lower) {
        return Some((*code).to_string());
    }
    let primary = lower.split(['-', '_']).next().unwrap_or("");
    (!primary.is_empty()).then(|| primary.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_languages_many_ways_and_engines_get_one_code() {
        for (given, want) in [
            ("en", Some("en")),
            ("EN", Some("en")),
            ("en-US", Some("en")),
            ("en_us", Some("en")),
            ("English", Some("en")),
            ("KOREAN", Some("ko")),
            ("zh-Hant", Some("zh")),
            ("haitian creole", Some("ht")),
            ("yue", Some("yue")),
            ("kor", Some("kor")),
            ("-US", None),
            ("", None),
        ] {
            assert_eq!(code(given).as_deref(), want, "{given}");
        }
        assert_eq!(name("ko"), Some("korean"));
        assert_eq!(name("xx"), None);
        assert_eq!(LANGUAGES.len(), 100);
    }
}
