//! The config's unit tests: parsing, defaults, the example file, validation.

use super::*;

#[test]
fn unknown_key_is_named() {
    let err = Config::from_toml("listen = \"127.0.0.1:1\"\nlisen = 3\n", ".".into())
        .unwrap_err()
        .to_string();
    assert!(err.contains("lisen"), "{err}");
    let err = Config::from_toml(
        "[workers.a]\ncommand=[\"x\"]\nmdoe = \"oneshot\"\n",
        ".".into(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("mdoe"), "{err}");
}

#[test]
fn defaults_serve_the_speech_pipeline() {
    let c = Config::default().finish(".".into()).unwrap();
    assert_eq!(c.listen.port(), 9090);
    assert_eq!(c.pipeline.stages, ["diarizer", "asr", "aligner"]);
    let spec = c.worker_spec("asr").unwrap();
    assert!(
        spec.argv[0].ends_with("workers/asr/.venv/bin/python"),
        "{:?}",
        spec.argv
    );
    assert_eq!(
        spec.argv[1..],
        ["-m".to_string(), "gpuhost_asr".to_string()]
    );
}

#[test]
fn example_config_is_valid_and_matches_defaults() {
    let text = include_str!("../../gpuhost.example.toml");
    let c = Config::from_toml(text, ".".into()).unwrap();
    let d = Config::default();
    assert_eq!(c.listen, d.listen);
    assert_eq!(c.pipeline.stages, d.pipeline.stages);
    assert_eq!(c.gpu.status.quiet_period_s, d.gpu.status.quiet_period_s);
    assert_eq!(c.limits.max_upload_bytes, d.limits.max_upload_bytes);
    assert_eq!(
        c.workers["asr"].load_timeout_s,
        d.workers["asr"].load_timeout_s
    );
}

#[test]
fn the_kubernetes_config_finds_its_workers_and_keeps_state_off_the_config_map() {
    let manifest = include_str!("../../deploy/kubernetes/daemonset.yaml");
    let key = "gpuhost.toml: |\n";
    let start = manifest.find(key).unwrap() + key.len();
    let text: String = manifest[start..]
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    // The token comes from a Secret through GPUHOST_TOKEN.
    let text = format!("token = \"from-the-secret\"\n{text}");
    let c = Config::from_toml(&text, "/etc/gpuhost".into()).unwrap();
    assert_eq!(
        c.sdk_dir(),
        std::path::Path::new("/opt/gpuhost/protocol/sdk")
    );
    assert_eq!(
        c.worker_home("asr"),
        std::path::Path::new("/opt/gpuhost/workers/asr")
    );
    assert!(!c.resolve(&c.state_dir).starts_with("/etc/gpuhost"));
}

#[test]
fn the_sdk_is_found_beside_the_workers_unless_set() {
    let c = Config::from_toml("workers_dir = \"/srv/gh/workers\"\n", "/etc/x".into()).unwrap();
    assert_eq!(c.sdk_dir(), std::path::Path::new("/srv/gh/protocol/sdk"));
    let c = Config::from_toml("[setup]\nsdk_dir = \"sdk\"\n", "/etc/x".into()).unwrap();
    assert_eq!(c.sdk_dir(), std::path::Path::new("/etc/x/sdk"));
}

#[test]
fn serving_beyond_loopback_needs_a_token_hard_to_guess() {
    // A client command reads the same file (to find the server): it is not refused.
    let open = Config::from_toml("listen = \"0.0.0.0:9090\"\n", ".".into()).unwrap();
    let err = open.check_serving().unwrap_err();
    assert!(err.to_string().contains("without a token"), "{err}");
    for weak in ["s3cret", "change-me"] {
        let c = Config::from_toml(
            &format!("listen = \"0.0.0.0:9090\"\ntoken = \"{weak}\"\n"),
            ".".into(),
        )
        .unwrap();
        let err = c.check_serving().unwrap_err().to_string();
        assert!(err.contains("easy to guess"), "{weak}: {err}");
    }
    let ok = Config::from_toml(
        "listen = \"0.0.0.0:9090\"\ntoken = \"s3cret-token-7f3a\"\n",
        ".".into(),
    )
    .unwrap();
    assert!(ok.check_serving().is_ok());
    // Loopback: anything goes.
    assert!(Config::from_toml("", ".".into())
        .unwrap()
        .check_serving()
        .is_ok());
    // Two listeners on one address.
    let c = Config::from_toml(
        "listen = \"127.0.0.1:9090\"\n[wyoming]\nlisten = \"127.0.0.1:9090\"\n",
        ".".into(),
    )
    .unwrap();
    let err = c.check_serving().unwrap_err().to_string();
    assert!(err.contains("[wyoming] listen"), "{err}");
}

#[test]
fn a_sample_stale_before_the_next_is_refused() {
    let err = Config::from_toml(
        "[gpu.status]\ninterval_s = 5\nstale_after_s = 0.5\n",
        ".".into(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("stale_after_s (0.5) must be more than interval_s (5)"),
        "{err}"
    );
}

#[test]
fn a_mistake_found_after_parsing_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuhost.toml");
    std::fs::write(&path, "[pipeline]\nstages = [\"nosuch\"]\n").unwrap();
    let err = Config::load(&path, true).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("invalid config file {}", path.display())),
        "{err}"
    );
}

#[test]
fn stage_must_name_a_worker() {
    let err = Config::from_toml("[pipeline]\nstages = [\"nope\"]\n", ".".into()).unwrap_err();
    assert!(err.to_string().contains("`nope`"), "{err}");
}

#[test]
fn parallel_groups_default_and_checks() {
    let d = Config::default();
    assert_eq!(d.pipeline.parallel_groups(), [["diarizer", "asr"]]);
    let only_asr = Config::from_toml("[pipeline]\nstages = [\"asr\"]\n", ".".into()).unwrap();
    assert!(only_asr.pipeline.parallel_groups().is_empty());
    let off = Config::from_toml("[pipeline]\nparallel = []\n", ".".into()).unwrap();
    assert!(off.pipeline.parallel_groups().is_empty());
    for (toml, says) in [
        ("parallel = [[\"asr\", \"ocr\"]]", "`ocr`"),
        ("parallel = [[\"diarizer\", \"aligner\"]]", "consecutive"),
        (
            "parallel = [[\"diarizer\", \"asr\"], [\"diarizer\", \"asr\"]]",
            "more than once",
        ),
    ] {
        let err = Config::from_toml(&format!("[pipeline]\n{toml}\n"), ".".into()).unwrap_err();
        assert!(err.to_string().contains(says), "{toml}: {err}");
    }
}

#[test]
fn needs_default_and_checks() {
    assert!(Config::default().pipeline.needs_map().is_empty());
    let on = Config::from_toml("[pipeline]\nneeds = { aligner = [\"asr\"] }\n", ".".into());
    assert_eq!(on.unwrap().pipeline.needs_map()["aligner"], ["asr"]);
    for (toml, says) in [
        ("needs = { ocr = [\"asr\"] }", "`ocr`"),
        ("needs = { asr = [\"aligner\"] }", "not `aligner`"),
        ("needs = { asr = [\"asr\"] }", "not `asr`"),
        ("needs = { aligner = [\"diarizer\"] }", "must include `asr`"),
        ("stages = [\"aligner\"]", "`asr` must come before it"),
        (
            "stages = [\"diarizer\", \"aligner\", \"asr\"]",
            "`asr` must come before it",
        ),
        (
            "stages = [\"asr\", \"aligner\"]\nparallel = [[\"asr\", \"aligner\"]]",
            "cannot run beside it",
        ),
    ] {
        let err = Config::from_toml(&format!("[pipeline]\n{toml}\n"), ".".into()).unwrap_err();
        assert!(err.to_string().contains(says), "{toml}: {err}");
    }
}

#[test]
fn token_edge_cases() {
    let t = |c: Option<&str>, e: Option<&str>| {
        effective_token(c.map(String::from), e.map(String::from))
    };
    assert_eq!(t(Some("abc"), Some("")).unwrap().as_deref(), Some("abc"));
    assert_eq!(
        t(Some("abc"), Some("  \n")).unwrap().as_deref(),
        Some("abc")
    );
    assert_eq!(
        t(Some("abc"), Some(" xyz\n")).unwrap().as_deref(),
        Some("xyz")
    );
    assert_eq!(t(Some(" abc \n"), None).unwrap().as_deref(), Some("abc"));
    assert_eq!(t(None, None).unwrap(), None);
    assert!(t(Some("   "), None).is_err());
    // The message names where the bad token came from.
    let from_env = t(Some("fine"), Some("a b")).unwrap_err().to_string();
    assert!(from_env.contains("GPUHOST_TOKEN"), "{from_env}");
    let from_file = t(Some("a b"), None).unwrap_err().to_string();
    assert!(from_file.contains("`token`"), "{from_file}");
}

#[test]
fn times_too_long_for_a_clock_are_config_errors_not_panics() {
    let base = "[pipeline]\nstages = [\"a\"]\n[workers.a]\ncommand = [\"x\"]\n";
    for (extra, key) in [
        ("task_timeout_s = 1e300\n", "task_timeout_s"),
        ("[gpu.status]\nquiet_period_s = 1e300\n", "quiet_period_s"),
        ("[arbiter]\nidle_unload_after_s = 1e20\n", "idle_unload_after_s"),
        ("[setup]\ntimeout_s = inf\n", "timeout_s"),
        (
            "[[services]]\nname = \"s\"\ncommand = [\"x\"]\nhealth_url = \"http://127.0.0.1:1/\"\nbusy_grace_s = -1\n",
            "busy_grace_s",
        ),
    ] {
        let err = Config::from_toml(&format!("{base}{extra}"), ".".into())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains("seconds"), "{extra}: {err}");
    }
    // Long but sane times stay allowed, as does 0 where it means "never".
    let ok = format!("{base}task_timeout_s = 86400\n[arbiter]\nidle_unload_after_s = 0\n");
    Config::from_toml(&ok, ".".into()).unwrap();
}

#[test]
fn settings_that_would_break_the_server_later_are_refused_at_load() {
    let svc = |extra: &str| {
        format!(
            "[[services]]\nname = \"llm\"\ncommand = [\"vllm\"]\nhealth_url = \"http://127.0.0.1:8000/health\"\n{extra}"
        )
    };
    for (toml, says) in [
        (
            "[workers.\"../escape\"]\ncommand = [\"x\"]\n",
            "letters, digits",
        ),
        ("[workers.\"\"]\ncommand = [\"x\"]\n", "letters, digits"),
        ("[workers.w]\ncommand = [\"\"]\n", "empty program"),
        (
            "[workers.w]\ncommand = [\"x\"]\nenv = { A = \"a\\u0000b\" }\n",
            "NUL",
        ),
        (
            "[workers.w]\ncommand = [\"x\"]\nenv = { \"\" = \"1\" }\n",
            "env has the key",
        ),
        (
            "[pipeline]\nstages = [\"w\", \"w\"]\n[workers.w]\ncommand = [\"x\"]\n",
            "`w` twice",
        ),
        ("[limits]\nmax_audio_seconds = nan\n", "max_audio_seconds"),
        ("[limits]\nmax_audio_seconds = -1\n", "max_audio_seconds"),
        ("[limits]\nmax_audio_seconds = 134217\n", "from 1 to 134216"),
        ("[limits]\nmax_audio_seconds = 0.01\n", "from 1 to"),
        ("[limits]\nmax_field_bytes = 0\n", "at least 128"),
        (
            "[wyoming]\nlisten = \"127.0.0.1:0\"\nlanguages = []\n",
            "no language to offer",
        ),
        ("[wyoming]\nlanguages = [\"english\"]\n", "language code"),
        ("[wyoming]\nlanguages = [\"\"]\n", "language code"),
        ("[gpu.status]\ninterval_s = 1e-10\n", "interval_s"),
        ("[gpu.status]\ninterval_s = 0.01\n", "at least 0.05"),
        ("[workers.asr]\nstop_grace_s = 1e-10\n", "stop_grace_s"),
        (
            "[http]\nmax_connections = 9223372036854775807\n",
            "max_connections",
        ),
        ("[http]\nheartbeat_s = 600\n", "at most 120"),
        ("token = \"é\"\n", "printable ASCII"),
        ("token = \"a b\"\n", "printable ASCII"),
        ("[gpu]\ndevice = 4294967296\n", "[gpu] device"),
        ("[gpu.status]\nidle_utilization_pct = 500\n", "0 to 100"),
        (
            "[limits]\nmax_upload_bytes = 0\n",
            "every upload would be refused",
        ),
        (
            "[arbiter]\nlease_ttl_s = 100\nmax_lease_ttl_s = 10\n",
            "above max_lease_ttl_s",
        ),
        (
            "[arbiter]\nlease_ttl_s = 0.05\n",
            "below 0.1 s, the shortest lease TTL",
        ),
        (
            &svc("").replace("http://127.0.0.1:8000/health", "not a url"),
            "not a URL",
        ),
        (
            &svc("").replace("http://127.0.0.1:8000/health", "ftp://h/x"),
            "http://",
        ),
        (
            &svc("release_url = \"nope\"\n"),
            "release_url \"nope\" is not a URL",
        ),
        (&svc("release_method = \"GE T\"\n"), "not an HTTP method"),
        (&svc("").replace("[\"vllm\"]", "[\"\"]"), "command is empty"),
        (&svc("").replace("\"llm\"", "\"a/b\""), "letters, digits"),
    ] {
        let err = Config::from_toml(toml, ".".into())
            .err()
            .unwrap_or_else(|| panic!("accepted: {toml}"))
            .to_string();
        assert!(err.contains(says), "{toml}: {err}");
    }
    assert!(Config::from_toml(&svc(""), ".".into()).is_ok());
}

#[test]
fn a_pipeline_without_workers_tables_starts_only_its_stages() {
    let services_only = Config::from_toml("[pipeline]\nstages = []\n", ".".into()).unwrap();
    assert!(services_only.workers.is_empty());
    let asr_only = Config::from_toml("[pipeline]\nstages = [\"asr\"]\n", ".".into()).unwrap();
    assert_eq!(asr_only.workers.keys().collect::<Vec<_>>(), ["asr"]);
    // With a [workers] table, the workers are as written, and the packaged ones its pipeline
    // names but the table does not.
    let written = Config::from_toml(
        "[pipeline]\nstages = []\n[workers.ocr]\ncommand = [\"ocr\"]\n",
        ".".into(),
    )
    .unwrap();
    assert_eq!(written.workers.keys().collect::<Vec<_>>(), ["ocr"]);
    let one_changed = Config::from_toml("[workers.asr]\nengine = \"base\"\n", ".".into()).unwrap();
    assert_eq!(
        one_changed.workers.keys().collect::<Vec<_>>(),
        ["aligner", "asr", "diarizer"]
    );
    assert_eq!(one_changed.workers["asr"].engine.as_deref(), Some("base"));
}

#[test]
fn a_wyoming_server_must_run_the_asr() {
    let on = "[wyoming]\nlisten = \"127.0.0.1:10300\"\n";
    for bad in ["stages = []\n", "stages = [\"diarizer\"]\n"] {
        let err = Config::from_toml(&format!("{on}{bad}"), ".".into())
            .unwrap_err()
            .to_string();
        assert!(err.contains("must include `asr`"), "{bad}: {err}");
    }
    assert!(Config::from_toml(on, ".".into()).is_ok());
    // Off, its stages do not matter.
    assert!(Config::from_toml("[wyoming]\nstages = []\n", ".".into()).is_ok());
}

#[test]
fn a_listen_address_that_is_not_one_is_said_plainly() {
    for toml in [
        "listen = \"localhost:9090\"\n",
        "[wyoming]\nlisten = \"localhost:10300\"\n",
    ] {
        let err = Config::from_toml(toml, ".".into()).unwrap_err().to_string();
        assert!(err.contains("not an IP address and port"), "{toml}: {err}");
    }
    let ok = Config::from_toml("[wyoming]\nlisten = \"[::1]:10300\"\n", ".".into()).unwrap();
    assert_eq!(ok.wyoming.listen.unwrap().port(), 10300);
    assert!(Config::from_toml("", ".".into())
        .unwrap()
        .wyoming
        .listen
        .is_none());
}

#[test]
fn a_parse_error_says_where_without_quoting_the_line() {
    // The line would be `token = "…` here: a secret in the log or the journal.
    let err = Config::from_toml(
        "listen = \"127.0.0.1:9090\"\ntoken = \"supersecretvalue\n",
        PathBuf::from("."),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(!err.contains("supersecret"), "{err}");
    // A value of the wrong type is not shown either; columns count characters.
    let err = Config::from_toml(
        "token = 123456
",
        PathBuf::from("."),
    )
    .unwrap_err()
    .to_string();
    assert!(!err.contains("123456"), "{err}");
    assert!(err.contains("invalid type"), "{err}");
    // The key is named, not only the line: `max_queue = -1` said "integer (value not shown),
    // expected usize" and nothing of which setting.
    assert!(err.contains("(`token`)"), "{err}");
    let err = Config::from_toml("[limits]\nmax_queue = -1\n", PathBuf::from("."))
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2, column 13 (`max_queue`)"), "{err}");
    // Inside a multi-line string a line's text before `=` is the value's, never named.
    let err = Config::from_toml(
        "[workers.asr]\nenv = { NOTE = \"\"\"\nhf_SECRETPART=rest C:\\Users\\me\n\"\"\" }\n",
        PathBuf::from("."),
    )
    .unwrap_err()
    .to_string();
    assert!(!err.contains("SECRET"), "{err}");
    let err = Config::from_toml("listen = \"é€é€\" x\n", PathBuf::from("."))
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 1, column 17"), "{err}");
    let err = Config::from_toml("[pipeline]\nstagez = []\n", PathBuf::from("."))
        .unwrap_err()
        .to_string();
    assert!(err.contains("stagez"), "what is wrong is still said: {err}");
}

#[test]
fn an_allowed_host_is_a_name_not_a_url() {
    let err = Config::from_toml(
        "[http]\nallowed_hosts = [\"http://myhost:9090/\"]\n",
        ".".into(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not URLs"), "{err}");
    let ok = Config::from_toml(
        "[http]\nallowed_hosts = [\"myhost\", \"myhost:9090\", \"[::1]:9090\"]\n",
        ".".into(),
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn a_watched_server_is_checked_as_a_service_is() {
    let watch = |body: &str| {
        Config::from_toml(&format!("[[gpu.watch]]\n{body}\n"), ".".into())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert_eq!(watch("name = \"ollama\"\npattern = \"ollama serve\"\nhealth_url = \"http://127.0.0.1:11434/\"\nrelease = { kind = \"ollama\", url = \"http://127.0.0.1:11434\" }"), "");
    for (body, says) in [
        ("name = \"\"\npattern = \"x\"", "name must be"),
        ("name = \"w\"\npattern = \"\"", "empty pattern"),
        ("name = \"w\"\npattern = \"x\"\nhealth_url = \"not a url\"", "health_url"),
        ("name = \"w\"\npattern = \"x\"\nrelease = { kind = \"http\", url = \"nope\" }", "release.url"),
        ("name = \"w\"\npattern = \"x\"\nrelease = { kind = \"http\", url = \"http://h/unload\", method = \"FETCH ME\" }", "not an HTTP method"),
    ] {
        let err = watch(body);
        assert!(err.contains(says), "{body}: {err}");
    }
    let twice =
        watch("name = \"vllm\"\npattern = \"a\"\n[[gpu.watch]]\nname = \"vllm\"\npattern = \"b\"");
    assert!(twice.contains("`vllm` is defined twice"), "{twice}");
}
