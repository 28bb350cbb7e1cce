//! The `[[gpu.watch]]` servers of a sample: their processes (running or on the GPU) and their
//! health URLs' answers.

use super::super::decision::WatchState;
use super::super::GpuProcess;
use super::Sampler;

impl Sampler {
    /// Each watched service: its pids (`found` among all processes, since a service may not
    /// have touched the GPU yet, plus those listed on it) and its health URL's answer.
    pub(super) async fn watched(
        &self,
        processes: &[GpuProcess],
        found: Vec<Vec<u32>>,
    ) -> Vec<WatchState> {
        let mut out = Vec::new();
        for (w, mut pids) in self.watch.iter().zip(found) {
            for p in processes
                .iter()
                .filter(|p| p.watch.as_deref() == Some(&w.name))
            {
                if !pids.contains(&p.pid) {
                    pids.push(p.pid);
                }
            }
            let healthy = match (&w.health_url, pids.is_empty()) {
                (Some(url), false) => Some(
                    self.http
                        .get(url)
                        .send()
                        .await
                        .map(|r| r.status().is_success())
                        .unwrap_or(false),
                ),
                _ => None,
            };
            out.push(WatchState {
                name: w.name.clone(),
                pids,
                healthy,
                health_url: w.health_url.clone(),
            });
        }
        out
    }
}
