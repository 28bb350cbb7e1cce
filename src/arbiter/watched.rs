//! Making room on servers gpuhost did not start (`[[gpu.watch]]` with a `release`): Ollama is
//! asked to unload every loaded model (`keep_alive: 0`), anything else gets its one HTTP call
//! (llama-swap `GET /unload`). The caller then checks, as for its own holders, that the memory
//! really came back.

use serde_json::{json, Value};

use crate::config::WatchRelease;

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
}

/// Makes the release call(s); returns what was released, for people (model names).
pub async fn release(
    http: &reqwest::Client,
    how: &WatchRelease,
) -> Result<Vec<String>, ReleaseError> {
    match how {
        WatchRelease::Http { url, method, body } => {
            let method =
                reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::POST);
            let mut request = http.request(method, url);
            if let Some(body) = body {
                request = request
                    .header("content-type", "application/json")
                    .body(body.clone());
            }
            call(request, url).await?;
            Ok(vec![url.clone()])
        }
        WatchRelease::Ollama { url } => {
            let base = url.trim_end_matches('/');
            let ps = format!("{base}/api/ps");
            let listed = call(http.get(&ps), &ps).await?;
            let models: Vec<String> = listed["models"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .filter_map(|m| m["name"].as_str().or(m["model"].as_str()))
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            for model in &models {
                // Generation models unload through /api/generate; embedding-only models refuse
                // it and unload through /api/embed.
                let unload = json!({ "model": model, "keep_alive": 0 });
                let generate = format!("{base}/api/generate");
                if call(http.post(&generate).json(&unload), &generate)
                    .await
                    .is_err()
                {
                    let embed = format!("{base}/api/embed");
                    call(http.post(&embed).json(&unload), &embed).await?;
                }
            }
            Ok(models)
        }
    }
}

async fn call(request: reqwest::RequestBuilder, url: &str) -> Result<Value, ReleaseError> {
    let response = request.send().await.map_err(|source| ReleaseError::Http {
        url: url.to_string(),
        source,
    })?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(ReleaseError::Status {
            url: url.to_string(),
            status: status.as_u16(),
            body: text.chars().take(300).collect(),
        });
    }
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}
