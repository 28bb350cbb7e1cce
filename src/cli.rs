//! Subcommands that act as clients or one-off runners (the server itself lives in the library).

pub(crate) mod control;
pub(crate) mod grant;
pub(crate) mod lease;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod speakers;
pub(crate) mod status;
pub(crate) mod transcribe;
pub(crate) mod upload;

/// Writes a command's result to stdout. A reader that went away (`| head -1`) ends the command
/// quietly; any other failure (a full disk) is an error that says so, not a panic.
pub(crate) fn print_result(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context("writing the result to stdout")),
    }
}

/// A job folder for a one-shot command, named as the server names its own, so that a sweep
/// finds it if this process is killed; an error names the folder it was to be made in.
pub(crate) fn job_folder(config: &gpuhost::Config) -> anyhow::Result<tempfile::TempDir> {
    use anyhow::Context;
    gpuhost::job::job_dir(config).with_context(|| {
        format!(
            "cannot make a job folder in {} (limits.temp_dir)",
            config.temp_dir().display()
        )
    })
}

/// Resolves on Ctrl-C or SIGTERM with the exit status a shell gives a command the signal
/// stopped (130, 143): a one-shot command then stops its workers, removes its job folder and
/// exits with it.
pub(crate) async fn interrupted() -> u8 {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => 130,
            _ = term.recv() => 143,
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            130
        }
    }
}

/// How long a server's event stream may say nothing before a client command gives up on it: the
/// server says what is still going on every `[http] heartbeat_s` (10 s by default, at most 120),
/// so a silence this long is a server that hangs or a network that is gone (TCP keepalive only
/// notices a machine that is gone).
pub(crate) const STREAM_SILENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// The next chunk of a server's event stream (`None`: it ended); an error once it has been
/// silent for [`STREAM_SILENCE`].
pub(crate) async fn next_chunk<S>(stream: &mut S) -> anyhow::Result<Option<bytes::Bytes>>
where
    S: futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
{
    use anyhow::Context;
    use futures_util::StreamExt;
    match tokio::time::timeout(STREAM_SILENCE, stream.next()).await {
        Err(_) => anyhow::bail!(
            "the server sent nothing for {} s, though it says how its work goes every \
             [http] heartbeat_s: it hangs, or the network to it is gone",
            STREAM_SILENCE.as_secs()
        ),
        Ok(None) => Ok(None),
        // Cut off mid-stream: the server stopped, restarted or was killed (reqwest's words
        // were "error decoding response body: unexpected EOF during chunk size line").
        Ok(Some(chunk)) => Ok(Some(chunk.context(
            "the server closed the connection before the end (it stopped, restarted or was killed)",
        )?)),
    }
}

/// Makes a one-shot command the subreaper of the workers it starts, so that what they detach
/// (`setsid`, a double fork) is adopted and can be swept by [`sweep_orphans`] at the end.
pub(crate) fn adopt_orphans() {
    if let Err(e) = gpuhost::process::adopted::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a child subreaper; a worker's detached children may outlive this command");
    }
}

/// Once the workers have stopped: kills what they left behind (see [`adopt_orphans`]).
pub(crate) async fn sweep_orphans() {
    let procfs = gpuhost::gpu::procfs::ProcFs::new("/proc");
    let _ =
        tokio::task::spawn_blocking(move || gpuhost::process::adopted::sweep_before_exit(&procfs))
            .await;
}

/// `text` from a server as the terminal should show it: control and invisible characters (an
/// escape sequence in a command line or a lease holder could retitle or redraw the terminal)
/// written as `\u{..}`, line breaks kept.
pub(crate) fn shown(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => c.to_string(),
            c if gpuhost::protocol::label::invisible(c) => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// The server a client subcommand talks to (`--server`, else the config's listen address) and
/// the token it shows (`--token`/`GPUHOST_TOKEN`, else the config's).
pub(crate) struct Remote {
    pub(crate) base: reqwest::Url,
    token: Option<String>,
    /// Connects within 10 s, with TCP keep-alive; short requests add [`QUICK`]. Nothing else is
    /// timed: a job, an unload behind a long task, a service that loads for many minutes take
    /// what they take.
    pub(crate) client: reqwest::Client,
}

/// Whether `event` is the queue place last shown, said again by the server while the wait
/// lasts (a heartbeat): shown once. Notes a new place in `last`.
pub(crate) fn said_again<E: Clone + PartialEq>(last: &mut Option<E>, event: &E) -> bool {
    if last.as_ref() == Some(event) {
        return true;
    }
    *last = Some(event.clone());
    false
}

/// How long a request that only reads state (status, the list of voices) may take in all.
pub(crate) const QUICK: std::time::Duration = std::time::Duration::from_secs(60);

impl Remote {
    pub(crate) fn new(
        config: &gpuhost::Config,
        server: Option<&str>,
        token: Option<&str>,
    ) -> anyhow::Result<Remote> {
        use anyhow::Context;
        let text = server.map_or_else(|| format!("http://{}", config.listen), String::from);
        let mut base = reqwest::Url::parse(&text).with_context(|| {
            if text.contains("://") {
                format!("{text} is not a URL")
            } else {
                format!("{text} is not a URL (give http://{text})")
            }
        })?;
        if base.scheme() != "http" && !text.contains("://") {
            // `localhost:9090` reads as a URL of the scheme `localhost`.
            anyhow::bail!("{text} is not a URL (give http://{text})");
        }
        if base.scheme() != "http" {
            anyhow::bail!(
                "{text}: this client speaks plain http:// only (gpuhost serves HTTP; reach a \
                 remote one through an SSH tunnel or a local proxy)"
            );
        }
        if base.cannot_be_a_base() {
            anyhow::bail!("{text} cannot be a base URL (give http://host:port[/prefix])");
        }
        // They would go as Basic auth in place of the bearer token (a 401 blamed on it).
        if !base.username().is_empty() || base.password().is_some() {
            anyhow::bail!(
                "the --server URL carries a user name or password; gpuhost takes a bearer \
                 token (--token, GPUHOST_TOKEN or the config's `token`): give http://host:port"
            );
        }
        // Paths are joined onto it: behind a proxy at `/gpu`, `status` is `/gpu/status`.
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            // A server machine that is gone (powered off, unplugged) ends a long stream too.
            .tcp_keepalive(std::time::Duration::from_secs(30))
            .build()
            .context("cannot set up an HTTP client")?;
        // As the server reads its own: a secrets file's trailing newline is not the token's.
        let token = token
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .or_else(|| config.token.clone());
        if let Some(bad) = token
            .as_deref()
            .and_then(|t| t.chars().find(|c| !c.is_ascii_graphic()))
        {
            anyhow::bail!(
                "the token (--token or GPUHOST_TOKEN) holds {bad:?}; a token is printable ASCII without spaces"
            );
        }
        Ok(Remote {
            base,
            token,
            client,
        })
    }

    /// `request` with the bearer token, when there is one.
    pub(crate) fn authed(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends `request` with the token. A refusal is an error that gives the URL, the status and
    /// the server's message.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<reqwest::Response> {
        use anyhow::Context;
        let (client, request) = self.authed(request).build_split();
        let request = request?;
        let url = request.url().clone();
        let response = client
            .execute(request)
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let code = response.status();
        if code.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        // The server's words, escaped as everything it sends is before it reaches the terminal;
        // not gpuhost's JSON (an HTML page from something else): its first 200 characters.
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
            .unwrap_or_else(|| body.chars().take(200).collect());
        let message = shown(message.trim());
        match message.is_empty() {
            true => anyhow::bail!("{url} answered {code}"),
            false => anyhow::bail!("{url} answered {code}: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{next_chunk, shown, Remote, STREAM_SILENCE};

    #[tokio::test(start_paused = true)]
    async fn a_silent_event_stream_is_given_up() {
        let mut silent = futures_util::stream::pending::<reqwest::Result<bytes::Bytes>>();
        let started = tokio::time::Instant::now();
        let why = next_chunk(&mut silent).await.unwrap_err().to_string();
        assert!(why.contains("sent nothing for 300 s"), "{why}");
        assert_eq!(started.elapsed(), STREAM_SILENCE);
        let mut two = futures_util::stream::iter([Ok(bytes::Bytes::from_static(b"{}\n"))]);
        assert_eq!(next_chunk(&mut two).await.unwrap().unwrap(), "{}\n");
        assert!(next_chunk(&mut two).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_refusal_s_text_is_escaped_and_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let page = format!(
            "\u{1b}]0;pwned\u{7}\u{1b}[2J<html>{}</html>",
            "x".repeat(500)
        );
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                page.len()
            );
            socket.write_all(head.as_bytes()).await.unwrap();
            socket.write_all(page.as_bytes()).await.unwrap();
        });
        let config = gpuhost::Config::default();
        let server = format!("http://127.0.0.1:{port}");
        let remote = Remote::new(&config, Some(&server), None).unwrap();
        let request = remote.client.get(remote.base.join("status").unwrap());
        let said = remote.send(request).await.unwrap_err().to_string();
        assert!(
            !said.contains('\u{1b}') && !said.contains('\u{7}'),
            "{said:?}"
        );
        assert!(said.contains("\\u{1b}]0;pwned"), "{said}");
        assert!(said.len() < 400, "cut to 200 characters: {}", said.len());
    }

    #[test]
    fn what_a_server_sends_cannot_drive_the_terminal() {
        let cmdline = "python3 \u{1b}]0;owned\u{7}\u{1b}[2J serve.py\nnext line \u{202e}txt";
        assert_eq!(
            shown(cmdline),
            "python3 \\u{1b}]0;owned\\u{7}\\u{1b}[2J serve.py\nnext line \\u{202e}txt"
        );
        assert_eq!(shown("민수 — vllm"), "민수 — vllm");
    }

    #[test]
    fn paths_join_onto_the_server_url_and_its_prefix() {
        let config = gpuhost::Config::default();
        let join = |server: Option<&str>, path: &str| {
            let remote = Remote::new(&config, server, None).unwrap();
            remote.base.join(path).unwrap().to_string()
        };
        let listen = format!("http://{}/status", config.listen);
        assert_eq!(join(None, "status"), listen);
        assert_eq!(join(Some("http://h:1"), "speakers"), "http://h:1/speakers");
        assert_eq!(
            join(Some("http://h:1/gpu"), "status"),
            "http://h:1/gpu/status"
        );
        assert_eq!(
            join(Some("http://h:1/gpu/"), "workers/asr/load"),
            "http://h:1/gpu/workers/asr/load"
        );
        assert!(Remote::new(&config, Some("mailto:x@y"), None).is_err());
        // Credentials in the URL went as Basic auth in place of the token.
        let err = Remote::new(&config, Some("http://u:p@h:1"), Some("t0k3n"))
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("bearer token"), "{err:#}");
        for bare in ["127.0.0.1:9090", "localhost:9090"] {
            let err = Remote::new(&config, Some(bare), None).err().unwrap();
            assert!(
                format!("{err:#}").contains(&format!("give http://{bare}")),
                "{err:#}"
            );
        }
        // A secrets file's newline is not the token's; a control character is refused plainly.
        let remote = Remote::new(&config, None, Some("s3cret\n")).unwrap();
        assert_eq!(remote.token.as_deref(), Some("s3cret"));
        let bad = Remote::new(&config, None, Some("s3\u{1b}cret"))
            .err()
            .unwrap();
        assert!(bad.to_string().contains("printable ASCII"), "{bad}");
    }
}
