//! The reaper sidecar: kills every live process group if the gateway dies,
//! however it dies (SIGKILL and OOM included).
//!
//! At start the gateway re-executes itself as `exec-gateway reaper` with a
//! pipe on its stdin, and writes `+PGID` when a group starts and `-PGID` when
//! it has closed. When the pipe reaches EOF (the kernel closes it when the
//! gateway exits, cleanly or not) the reaper SIGKILLs every group still
//! registered, then everything in its gateway's cgroup subtree (which
//! reaches `setsid` escapers too), and exits. Compared with
//! `PR_SET_PDEATHSIG` this also reaches grandchildren, and lets children be
//! spawned with `posix_spawn` (no `pre_exec` hook).

use std::collections::HashSet;
use std::io::{self, BufRead as _, Write as _};
use std::process::{Command, ExitCode, Stdio};

use parking_lot::Mutex;

/// Handle the gateway keeps to its reaper.
#[derive(Debug)]
pub struct Reaper {
    pipe: Mutex<Option<std::process::ChildStdin>>,
    child: Mutex<std::process::Child>,
}

impl Reaper {
    /// Start `<this executable> reaper`.
    pub fn start() -> io::Result<Reaper> {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("reaper")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Its own group: a terminal's Ctrl-C to the gateway's group must
            // not take the reaper down first.
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        Ok(Reaper {
            pipe: Mutex::new(pipe),
            child: Mutex::new(child),
        })
    }

    fn send(&self, line: &str) {
        let mut pipe = self.pipe.lock();
        if let Some(p) = pipe.as_mut()
            && p.write_all(line.as_bytes()).is_err()
        {
            tracing::error!(
                "the reaper sidecar is gone; processes will not be killed if the gateway dies"
            );
            *pipe = None;
        }
    }

    pub fn register(&self, pgid: i32) {
        self.send(&format!("+{pgid}\n"));
    }

    pub fn unregister(&self, pgid: i32) {
        self.send(&format!("-{pgid}\n"));
    }

    /// The gateway's cgroup v2 instance directory: killed (`cgroup.kill`,
    /// its whole subtree) and removed when the gateway dies.
    pub fn watch_cgroup(&self, dir: &std::path::Path) {
        self.send(&format!("c{}\n", dir.display()));
    }

    /// A mount (a tenant's `/tmp`) detached when the gateway dies.
    pub fn watch_mount(&self, dir: &std::path::Path) {
        self.send(&format!("u{}\n", dir.display()));
    }

    /// Clean stop: close the pipe (the reaper kills what is left) and reap it.
    pub fn stop(&self) {
        self.pipe.lock().take();
        let _ = self.child.lock().wait();
    }
}

/// Body of `exec-gateway reaper`.
pub fn run() -> ExitCode {
    // Captured now: once the gateway dies, our parent is init.
    let gateway = std::os::unix::process::parent_id();
    let mut live: HashSet<i32> = HashSet::new();
    let mut v2: Option<std::path::PathBuf> = None;
    let mut mounts: Vec<std::path::PathBuf> = Vec::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (op, pgid) = line.split_at(line.len().min(1));
        if op == "c" {
            v2 = Some(std::path::PathBuf::from(pgid));
            continue;
        }
        if op == "u" {
            mounts.push(std::path::PathBuf::from(pgid));
            continue;
        }
        let Ok(pgid) = pgid.parse::<i32>() else {
            continue;
        };
        match op {
            "+" => {
                live.insert(pgid);
            }
            "-" => {
                live.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in live {
        super::signal::kill_group(pgid);
    }
    // The tenants' /tmp mounts (nothing of them outlives the gateway).
    for m in mounts {
        super::disk::unmount(&m);
    }
    // `setsid` escapers left their groups but not their cgroups.
    match v2 {
        Some(dir) => {
            super::cgroup::remove_v2_tree(&dir);
        }
        None => {
            super::cgroup::remove_instance(gateway);
        }
    }
    ExitCode::SUCCESS
}
