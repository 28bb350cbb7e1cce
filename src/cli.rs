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
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
            .unwrap_or(body);
        anyhow::bail!("{url} answered {code}: {message}")
    }
}
