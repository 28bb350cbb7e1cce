//! Subcommands that act as clients or one-off runners (the server itself lives in the library).

pub(crate) mod control;
pub(crate) mod lease;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod speakers;
pub(crate) mod status;
pub(crate) mod transcribe;

/// The server a client subcommand talks to (`--server`, else the config's listen address) and
/// the token it shows (`--token`/`GPUHOST_TOKEN`, else the config's).
pub(crate) struct Remote {
    pub(crate) base: reqwest::Url,
    token: Option<String>,
}

impl Remote {
    pub(crate) fn new(
        config: &gpuhost::Config,
        server: Option<&str>,
        token: Option<&str>,
    ) -> anyhow::Result<Remote> {
        use anyhow::Context;
        let base = server.map_or_else(|| format!("http://{}", config.listen), String::from);
        Ok(Remote {
            base: reqwest::Url::parse(&base).with_context(|| format!("{base} is not a URL"))?,
            token: token.map(String::from).or_else(|| config.token.clone()),
        })
    }

    /// `request` with the bearer token, when there is one.
    pub(crate) fn authed(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}
