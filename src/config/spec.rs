//! A worker's launch description (`WorkerSpec`) from its `[workers.<name>]` table: the venv's
//! python by default, the engine and options as environment, the GPU pinned.

use std::path::PathBuf;
use std::time::Duration;

use super::{pin_device, Config, WorkerSpec};

impl Config {
    /// `workers/<name>`, resolved.
    pub fn worker_home(&self, name: &str) -> PathBuf {
        self.resolve(&self.workers_dir).join(name)
    }

    /// The worker SDK: `[setup] sdk_dir`, or `protocol/sdk` beside the workers folder (a config
    /// kept outside the checkout, such as `/etc/gpuhost/gpuhost.toml` with `workers_dir` naming
    /// the checkout's `workers`, finds the checkout's SDK).
    pub fn sdk_dir(&self) -> PathBuf {
        match &self.setup.sdk_dir {
            Some(dir) => self.resolve(dir),
            None => {
                let workers = self.resolve(&self.workers_dir);
                let workers = std::path::absolute(&workers).unwrap_or(workers);
                workers
                    .parent()
                    .unwrap_or(&workers)
                    .join("protocol")
                    .join("sdk")
            }
        }
    }

    /// The launch description for worker `name`, with defaults filled in.
    pub fn worker_spec(&self, name: &str) -> Option<WorkerSpec> {
        let w = self.workers.get(name)?;
        let home = self.resolve(&self.workers_dir).join(name);
        let argv = if w.command.is_empty() {
            let module = w
                .module
                .clone()
                .unwrap_or_else(|| format!("gpuhost_{name}"));
            vec![
                home.join(".venv/bin/python").display().to_string(),
                "-m".into(),
                module,
            ]
        } else {
            w.command.clone()
        };
        let cwd = match &w.cwd {
            Some(cwd) => self.resolve(cwd),
            None if home.is_dir() => home,
            None => self.base_dir.clone(),
        };
        let mut env = w.env.clone();
        if let Some(device) = w.device {
            pin_device(&mut env, device);
        }
        if let Some(engine) = &w.engine {
            env.insert("GPUHOST_ENGINE".into(), engine.clone());
        }
        if !w.options.is_empty() {
            env.insert(
                "GPUHOST_OPTIONS".into(),
                serde_json::Value::Object(w.options.clone()).to_string(),
            );
        }
        Some(WorkerSpec {
            name: name.to_string(),
            argv,
            cwd,
            env,
            mode: w.mode,
            vram_mib: w.vram_mib,
            load_timeout: Duration::from_secs_f64(w.load_timeout_s),
            task_timeout: Duration::from_secs_f64(w.task_timeout_s),
            stop_grace: Duration::from_secs_f64(w.stop_grace_s),
            cancel_grace: Duration::from_secs_f64(w.cancel_grace_s),
            options: w.options.clone(),
            unloaded_fallback: self.arbiter.fallback,
            device: w.device.unwrap_or(self.gpu.device as u32),
        })
    }
}
