//! What a process spent, from `/proc`: CPU time (all its threads, those
//! that ended included) and context switches (its live threads'), read
//! before and after a run to give a per-operation cost.

use std::time::Duration;

/// A process's CPU time and context switches at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    cpu: Duration,
    switches: u64,
}

impl Cost {
    /// `pid`'s cost so far (zero for what cannot be read).
    pub(crate) fn of(pid: u32) -> Cost {
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)
            .unwrap_or(100) as f64;
        // utime and stime are fields 14 and 15, counted after the command
        // name's closing parenthesis (field 2, which may hold spaces).
        let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                let utime: f64 = f.get(11)?.parse().ok()?;
                let stime: f64 = f.get(12)?.parse().ok()?;
                Some(Duration::from_secs_f64((utime + stime) / ticks))
            })
            .unwrap_or_default();
        let mut switches = 0;
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
                    continue;
                };
                switches += status
                    .lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum::<u64>();
            }
        }
        Cost { cpu, switches }
    }

    /// Per operation from `self` (before) to `after`, over `n` operations:
    /// CPU in microseconds and context switches.
    pub(crate) fn per(self, after: Cost, n: usize) -> (f64, f64) {
        let n = n.max(1) as f64;
        (
            after.cpu.saturating_sub(self.cpu).as_secs_f64() * 1e6 / n,
            after.switches.saturating_sub(self.switches) as f64 / n,
        )
    }
}
