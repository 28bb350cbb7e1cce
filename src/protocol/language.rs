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

/// ISO 639-2 codes (bibliographic and terminology, `ger` and `deu`) of Whisper's languages, and
/// `jv`, Javanese's ISO 639-1 code, which Whisper writes `jw`: the code engines take for each.
const OTHER_CODES: &[(&str, &str)] = &[
    ("eng", "en"),
    ("zho", "zh"),
    ("chi", "zh"),
    ("deu", "de"),
    ("ger", "de"),
    ("spa", "es"),
    ("rus", "ru"),
    ("kor", "ko"),
    ("fra", "fr"),
    ("fre", "fr"),
    ("jpn", "ja"),
    ("por", "pt"),
    ("tur", "tr"),
    ("pol", "pl"),
    ("cat", "ca"),
    ("nld", "nl"),
    ("dut", "nl"),
    ("ara", "ar"),
    ("swe", "sv"),
    ("ita", "it"),
    ("ind", "id"),
    ("hin", "hi"),
    ("fin", "fi"),
    ("vie", "vi"),
    ("heb", "he"),
    ("ukr", "uk"),
    ("ell", "el"),
    ("gre", "el"),
    ("msa", "ms"),
    ("may", "ms"),
    ("ces", "cs"),
    ("cze", "cs"),
    ("ron", "ro"),
    ("rum", "ro"),
    ("dan", "da"),
    ("hun", "hu"),
    ("tam", "ta"),
    ("nor", "no"),
    ("tha", "th"),
    ("urd", "ur"),
    ("hrv", "hr"),
    ("bul", "bg"),
    ("lit", "lt"),
    ("lat", "la"),
    ("mri", "mi"),
    ("mao", "mi"),
    ("mal", "ml"),
    ("cym", "cy"),
    ("wel", "cy"),
    ("slk", "sk"),
    ("slo", "sk"),
    ("tel", "te"),
    ("fas", "fa"),
    ("per", "fa"),
    ("lav", "lv"),
    ("ben", "bn"),
    ("srp", "sr"),
    ("aze", "az"),
    ("slv", "sl"),
    ("kan", "kn"),
    ("est", "et"),
    ("mkd", "mk"),
    ("mac", "mk"),
    ("bre", "br"),
    ("eus", "eu"),
    ("baq", "eu"),
    ("isl", "is"),
    ("ice", "is"),
    ("hye", "hy"),
    ("arm", "hy"),
    ("nep", "ne"),
    ("mon", "mn"),
    ("bos", "bs"),
    ("kaz", "kk"),
    ("sqi", "sq"),
    ("alb", "sq"),
    ("swa", "sw"),
    ("glg", "gl"),
    ("mar", "mr"),
    ("pan", "pa"),
    ("sin", "si"),
    ("khm", "km"),
    ("sna", "sn"),
    ("yor", "yo"),
    ("som", "so"),
    ("afr", "af"),
    ("oci", "oc"),
    ("kat", "ka"),
    ("geo", "ka"),
    ("bel", "be"),
    ("tgk", "tg"),
    ("snd", "sd"),
    ("guj", "gu"),
    ("amh", "am"),
    ("yid", "yi"),
    ("lao", "lo"),
    ("uzb", "uz"),
    ("fao", "fo"),
    ("hat", "ht"),
    ("pus", "ps"),
    ("tuk", "tk"),
    ("nno", "nn"),
    ("mlt", "mt"),
    ("san", "sa"),
    ("ltz", "lb"),
    ("mya", "my"),
    ("bur", "my"),
    ("bod", "bo"),
    ("tib", "bo"),
    ("tgl", "tl"),
    ("mlg", "mg"),
    ("asm", "as"),
    ("tat", "tt"),
    ("lin", "ln"),
    ("hau", "ha"),
    ("bak", "ba"),
    ("jav", "jw"),
    ("jv", "jw"),
    ("sun", "su"),
];

/// The English name of a Whisper language code (`ko` → `korean`).
pub fn name(code: &str) -> Option<&'static str> {
    LANGUAGES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// The code a request's `language` stands for: a language's English name (any case) is its
/// code, and otherwise the primary subtag, lowercased, its ISO 639-2 form taken as the two-letter
/// one (`EN`, `en-US`, `zh_Hant`, `kor`, `ger` → `en`, `en`, `zh`, `ko`, `de`): engines take bare
/// lowercase codes, and no engine here tells regions or scripts apart. `None` when nothing is
/// left (`-US`).
pub fn code(language: &str) -> Option<String> {
    let lower = language.trim().to_ascii_lowercase();
    if let Some((code, _)) = LANGUAGES.iter().find(|(_, n)| *n == lower) {
        return Some((*code).to_string());
    }
    let primary = lower.split(['-', '_']).next().unwrap_or("");
    if let Some((_, code)) = OTHER_CODES.iter().find(|(other, _)| *other == primary) {
        return Some((*code).to_string());
    }
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
            ("kor", Some("ko")),
            ("KOR-kr", Some("ko")),
            ("eng", Some("en")),
            ("ger", Some("de")),
            ("deu", Some("de")),
            ("jv", Some("jw")),
            ("haw", Some("haw")),
            ("tlh", Some("tlh")),
            ("-US", None),
            ("", None),
        ] {
            assert_eq!(code(given).as_deref(), want, "{given}");
        }
        assert_eq!(name("ko"), Some("korean"));
        assert_eq!(name("xx"), None);
        assert_eq!(LANGUAGES.len(), 100);
        // Every other code stands for one of Whisper's languages, and none is one itself.
        for (other, code) in OTHER_CODES {
            assert!(name(code).is_some(), "{other} → {code}");
            assert!(name(other).is_none(), "{other}");
        }
        let alpha3 = OTHER_CODES.iter().filter(|(o, _)| o.len() == 3).count();
        assert!(
            alpha3 >= 97,
            "one or two ISO 639-2 codes for each language but yue and haw"
        );
    }
}
