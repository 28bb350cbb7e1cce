//! Reads command lines from a `/proc` tree (configurable, so tests can use a fake one). A GPU
//! process whose own command line is empty (kernel threads, WSL) is explained by its nearest
//! ancestor that has one.

use std::path::PathBuf;

/// How far up the parent chain to look.
const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

/// A command line and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    pub command: String,
    /// Set when the command is an ancestor's.
    pub from_pid: Option<u32>,
    pub note: Option<String>,
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    /// The NUL-separated command line joined by spaces; `None` when the pid is not visible.
    pub fn cmdline(&self, pid: u32) -> Option<String> {
        let raw = std::fs::read(self.root.join(pid.to_string()).join("cmdline")).ok()?;
        let parts: Vec<String> = raw
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        Some(parts.join(" ").trim().to_string())
    }

    pub fn ppid(&self, pid: u32) -> Option<u32> {
        let status =
            std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The process group of `pid` (field 5 of its `stat`, after the command in parentheses).
    pub fn pgid(&self, pid: u32) -> Option<u32> {
        self.stat_field(pid, 5)
    }

    /// When `pid` started, in clock ticks since boot (field 22 of its `stat`): with the pid, it
    /// names one process, even after the pid is reused.
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        self.stat_field(pid, 22)
    }

    /// Where this process's command line lies in its memory (fields 48 and 49 of
    /// `/proc/self/stat`: the range `/proc/PID/cmdline` is read from).
    pub fn own_arg_range(&self) -> Option<(usize, usize)> {
        let stat = std::fs::read_to_string(self.root.join("self").join("stat")).ok()?;
        let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(48 - 3);
        Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
    }

    /// The value of `name` in `pid`'s environment as it was started (`/proc/PID/environ`);
    /// `None` when absent or unreadable (another user's process, one gone).
    pub fn environ_value(&self, pid: u32, name: &str) -> Option<Vec<u8>> {
        let env = std::fs::read(self.root.join(pid.to_string()).join("environ")).ok()?;
        env.split(|&b| b == 0).find_map(|entry| {
            let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            Some(value.to_vec())
        })
    }

    /// Field `n` (counted from 1, as in proc(5)) of `pid`'s `stat`, from the 3rd on.
    fn stat_field<T: std::str::FromStr>(&self, pid: u32, n: usize) -> Option<T> {
        let stat = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(n - 3)?
            .parse()
            .ok()
    }

    /// Whether `pid` has exited and waits to be reaped (`State: Z` in its status).
    pub fn zombie(&self, pid: u32) -> bool {
        std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("State:"))
                .is_some_and(|v| v.trim_start().starts_with('Z'))
        })
    }

    pub fn comm(&self, pid: u32) -> Option<String> {
        let comm = std::fs::read_to_string(self.root.join(pid.to_string()).join("comm")).ok()?;
        Some(comm.trim().to_string()).filter(|c| !c.is_empty())
    }

    /// The command that explains `pid`.
    pub fn command(&self, pid: u32) -> Command {
        match self.cmdline(pid) {
            None => Command {
                command: String::new(),
                from_pid: None,
                note: Some(format!(
                    "pid {pid} is not visible in {} (another PID namespace?)",
                    self.root.display()
                )),
            },
            Some(own) if !own.is_empty() => Command {
                command: own,
                from_pid: None,
                note: None,
            },
            // An exited process has no command line: its parent's (init's, for an orphan) is
            // not what holds the GPU.
            Some(_) if self.zombie(pid) => Command {
                command: String::new(),
                from_pid: None,
                note: Some(format!("pid {pid} has exited (a zombie not yet reaped)")),
            },
            Some(_) => {
                let mut current = pid;
                for _ in 0..MAX_DEPTH {
                    match self.ppid(current) {
                        // Not init: every orphan's parent, which explains none of them.
                        Some(parent) if parent > 1 && parent != current => {
                            current = parent;
                            match self.cmdline(parent) {
                                Some(cmd) if !cmd.is_empty() => return Command {
                                    command: cmd,
                                    from_pid: Some(parent),
                                    note: Some(format!("pid {pid} has an empty command line; this is its ancestor {parent}'s")),
                                },
                                Some(_) => {}
                                // Exited between the two reads, or in another namespace.
                                None => return Command {
                                    command: String::new(),
                                    from_pid: None,
                                    note: Some(format!("pid {pid} has an empty command line and its ancestor {parent} is gone or not visible")),
                                },
                            }
                        }
                        Some(1) => {
                            return Command {
                                command: String::new(),
                                from_pid: None,
                                note: Some(format!("pid {pid} has an empty command line, and so has every ancestor below init")),
                            }
                        }
                        _ => break,
                    }
                }
                Command {
                    command: String::new(),
                    from_pid: None,
                    note: Some(format!(
                        "pid {pid} and its ancestors have empty command lines"
                    )),
                }
            }
        }
    }

    /// `pid` and its ancestors, nearest first.
    pub fn lineage(&self, pid: u32) -> Vec<u32> {
        let mut out = vec![pid];
        let mut current = pid;
        for _ in 0..MAX_DEPTH {
            match self.ppid(current) {
                Some(parent) if parent > 0 && parent != current => {
                    out.push(parent);
                    current = parent;
                }
                _ => break,
            }
        }
        out
    }

    /// Every visible pid, in order.
    pub fn pids(&self) -> Vec<u32> {
        self.try_pids().unwrap_or_default()
    }

    /// Every visible pid, in order; `None` when the tree cannot be read whole.
    pub fn try_pids(&self) -> Option<Vec<u32>> {
        let entries = std::fs::read_dir(&self.root).ok()?;
        let mut pids = Vec::new();
        for entry in entries {
            if let Some(pid) = entry
                .ok()?
                .file_name()
                .to_str()
                .and_then(|n| n.parse().ok())
            {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        Some(pids)
    }

    /// Whether this tree is this process's own PID namespace's (`self` names our pid): only then
    /// do its pids name the processes this process can signal.
    pub fn is_own(&self) -> bool {
        std::fs::read_link(self.root.join("self"))
            .ok()
            .and_then(|l| l.to_str()?.parse::<u32>().ok())
            == Some(std::process::id())
    }

    /// Whether `pid` is positively gone: its entry does not exist (a failed read is not that).
    pub fn gone(&self, pid: u32) -> bool {
        std::fs::metadata(self.root.join(pid.to_string()))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    }

    /// `root` and every visible process below it, found in one pass over the tree.
    pub fn descendants(&self, root: u32) -> Vec<u32> {
        self.descendants_of(&[root])
    }

    /// The children of `pid`, from `task/*/children` (one file per thread): reads only what is
    /// below `pid`, not the whole tree. `None` when any of it cannot be read (or the kernel
    /// lacks `CONFIG_PROC_CHILDREN`).
    pub fn children(&self, pid: u32) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        for task in std::fs::read_dir(self.root.join(pid.to_string()).join("task")).ok()? {
            let list = std::fs::read_to_string(task.ok()?.path().join("children")).ok()?;
            for child in list.split_whitespace() {
                out.push(child.parse().ok()?);
            }
        }
        Some(out)
    }

    /// The children of `pid`: from its children lists when the kernel has them, else every
    /// visible pid whose parent reads as `pid` (`None` when the tree cannot be listed).
    pub fn children_or_scan(&self, pid: u32) -> Option<Vec<u32>> {
        self.children(pid).or_else(|| {
            let pids = self.try_pids()?;
            Some(
                pids.into_iter()
                    .filter(|&p| self.ppid(p) == Some(pid))
                    .collect(),
            )
        })
    }

    /// `roots` and every visible process below any of them, each once: through the children
    /// lists when the kernel has them, else in one pass over the whole tree.
    pub fn descendants_of(&self, roots: &[u32]) -> Vec<u32> {
        self.descendants_by_children(roots)
            .unwrap_or_else(|| self.descendants_by_scan(roots))
    }

    fn descendants_by_children(&self, roots: &[u32]) -> Option<Vec<u32>> {
        let mut seen = std::collections::HashSet::new();
        let mut tree: Vec<u32> = roots.iter().copied().filter(|r| seen.insert(*r)).collect();
        let mut i = 0;
        while i < tree.len() {
            let pid = tree[i];
            // A root or child that is gone has no children left; any other failure: scan.
            let children = match self.children(pid) {
                Some(c) => c,
                None if self.gone(pid) => Vec::new(),
                None => return None,
            };
            tree.extend(children.into_iter().filter(|c| seen.insert(*c)));
            i += 1;
        }
        Some(tree)
    }

    fn descendants_by_scan(&self, roots: &[u32]) -> Vec<u32> {
        let parents: Vec<(u32, u32)> = self
            .pids()
            .into_iter()
            .filter_map(|pid| Some((pid, self.ppid(pid)?)))
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut tree: Vec<u32> = roots.iter().copied().filter(|r| seen.insert(*r)).collect();
        let mut i = 0;
        while i < tree.len() {
            let pid = tree[i];
            let children = parents.iter().filter(|(_, p)| *p == pid).map(|(c, _)| *c);
            let new: Vec<u32> = children.filter(|c| seen.insert(*c)).collect();
            tree.extend(new);
            i += 1;
        }
        tree
    }

    /// For each pattern, the visible processes whose command line contains it, but gpuhost
    /// itself (`own`) and its children that run its own program (the orphan guard, a fork with
    /// its command line; audio decoders): `gpuhost --config ollama.toml serve` is no ollama.
    /// One pass over the tree, however many patterns.
    pub fn find(&self, patterns: &[&str], own: u32) -> Vec<Vec<u32>> {
        let mut found = vec![Vec::new(); patterns.len()];
        if patterns.is_empty() {
            return found;
        }
        let program = |cmdline: &str| cmdline.split(' ').next().unwrap_or_default().to_string();
        let own_program = self.cmdline(own).map(|c| program(&c));
        for pid in self.pids().into_iter().filter(|&pid| pid != own) {
            let Some(cmdline) = self.cmdline(pid) else {
                continue;
            };
            let matching: Vec<usize> = (0..patterns.len())
                .filter(|&i| cmdline.contains(patterns[i]))
                .collect();
            if matching.is_empty() {
                continue;
            }
            let ours = self.ppid(pid) == Some(own)
                && own_program
                    .as_deref()
                    .is_some_and(|p| p == program(&cmdline));
            if ours {
                continue;
            }
            for i in matching {
                found[i].push(pid);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests;
