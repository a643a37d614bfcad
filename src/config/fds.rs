//! The file-descriptor fit: what the connection and process caps may hold
//! open, and lowering the defaulted ones to fit `RLIMIT_NOFILE`.

use super::Settings;
use super::common::ConfigError;

/// Descriptors kept for everything but connections and process pipes
/// (listeners, key files, the reaper, cgroup files, logs).
pub const FD_RESERVE: u64 = 256;
/// Descriptors one running process may hold in the gateway (stdin, stdout,
/// stderr, pidfd).
pub const FDS_PER_PROCESS: u64 = 4;
/// Descriptors a worker holds in the gateway (its link socket and pidfd).
pub const FDS_PER_WORKER: u64 = 2;

/// The caps a restart would change: connections, gRPC connections,
/// unauthenticated connections, processes, active tenants.
pub type ServerCaps = [usize; 5];

/// What the descriptor fit was made against (see
/// [`Settings::fit_fd_limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdFit {
    /// `RLIMIT_NOFILE` at the fit.
    pub limit: u64,
    /// The caps as the file (or its defaults) said, before any lowering.
    pub written: ServerCaps,
    /// The active tenants the fit made room for.
    pub active_tenants: usize,
}

/// See [`Settings::caps_explicit`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapsExplicit {
    pub connections: bool,
    pub grpc: bool,
    pub unauthenticated: bool,
    pub processes: bool,
    pub active_tenants: bool,
}

impl Settings {
    /// Descriptors one active tenant may hold: its workers, `fs/open`
    /// handles and gRPC streams (each holds a file); the most any
    /// configured or templated tenant may.
    pub fn fds_per_active_tenant(&self) -> u64 {
        self.tenants
            .values()
            .chain(self.template.as_ref().map(|t| &t.example))
            .map(|t| {
                t.workers_max as u64 * FDS_PER_WORKER
                    + t.max_open_files as u64
                    + t.max_streams as u64
            })
            .max()
            .unwrap_or(0)
    }

    /// Tenants that may be active at once: every configured one, or
    /// `max_active_tenants` where fewer (or a template makes any number).
    pub fn active_tenants_bound(&self) -> usize {
        if self.template.is_some() {
            self.max_active_tenants
        } else {
            self.max_active_tenants.min(self.tenants.len())
        }
    }

    /// (descriptors of each cap, kept as it is): websocket, gRPC,
    /// unauthenticated, processes, active tenants. Caps set in the file
    /// are kept, and so is the active tenants' when `keep_tenants`.
    fn fd_caps(&self, keep_tenants: bool) -> [(u64, bool); 5] {
        let e = self.caps_explicit;
        let grpc = if self.grpc_listen.is_some() {
            self.grpc_max_connections as u64
        } else {
            0
        };
        [
            (self.max_connections as u64, e.connections),
            (grpc, e.grpc),
            (self.max_unauthenticated as u64, e.unauthenticated),
            (FDS_PER_PROCESS * self.max_processes as u64, e.processes),
            (
                self.fds_per_active_tenant() * self.active_tenants_bound() as u64,
                e.active_tenants || keep_tenants,
            ),
        ]
    }

    /// The descriptor-taking caps in force now.
    fn caps_in_force(&self) -> ServerCaps {
        [
            self.max_connections,
            self.grpc_max_connections,
            self.max_unauthenticated,
            self.max_processes,
            self.max_active_tenants,
        ]
    }

    /// The descriptor-taking caps as written in the file (or defaulted),
    /// before the fit lowered any: what a restart would change.
    pub fn caps_as_written(&self) -> ServerCaps {
        self.fd_fit
            .map_or_else(|| self.caps_in_force(), |f| f.written)
    }

    /// The error of caps that need `need` descriptors where `limit` are.
    fn fd_misfit(&self, need: u64, limit: u64) -> String {
        format!(
            "connection, process and tenant caps need up to {need} open files (server.max_connections {} + server.grpc_max_connections {} + server.max_unauthenticated {} + {FDS_PER_PROCESS} x exec.max_processes {} + {} active tenants x {} for their workers, max_open_files and max_streams + {} reserved) but RLIMIT_NOFILE allows {limit}: lower them or raise the limit",
            self.max_connections,
            self.fd_caps(true)[1].0,
            self.max_unauthenticated,
            self.max_processes,
            self.active_tenants_bound(),
            self.fds_per_active_tenant(),
            self.reserved_fds()
        )
    }

    /// Whether the tenants of `new` (a re-read configuration) fit the
    /// descriptors of this running configuration: its connection,
    /// process and active-tenant caps stay until a restart, so the new
    /// tenants' `workers_max`, `max_open_files` and `max_streams` must
    /// fit beside them, as at start. Refused with the start's error.
    pub fn check_reload_fit(&self, new: &Settings) -> Result<(), ConfigError> {
        let Some(fit) = self.fd_fit else {
            return Ok(());
        };
        let mut running = self.clone();
        running.tenants = new.tenants.clone();
        running.template = new.template.clone();
        // The active tenants the running fit made room for: no more than
        // the configured ones (a reload may add tenants up to the cap in
        // force) unless a template makes any number.
        if running.template.is_none() && self.template.is_none() {
            running.max_active_tenants = fit.active_tenants;
        }
        let need = running.fds_needed();
        if need > fit.limit {
            return Err(ConfigError(format!(
                "{} (the [server] and [exec] caps in force change only at a restart)",
                running.fd_misfit(need, fit.limit)
            )));
        }
        Ok(())
    }

    /// Descriptors not scaled by the caps.
    fn reserved_fds(&self) -> u64 {
        FD_RESERVE
    }

    /// Descriptors the caps may take at once.
    pub fn fds_needed(&self) -> u64 {
        self.reserved_fds() + self.fd_caps(true).iter().map(|(n, _)| n).sum::<u64>()
    }

    /// (descriptors of the caps kept, of those lowered) under `keep_tenants`.
    fn fixed_and_flexible(&self, keep_tenants: bool) -> (u64, u64) {
        let caps = self.fd_caps(keep_tenants);
        let fixed = self.reserved_fds() + caps.iter().filter(|c| c.1).map(|c| c.0).sum::<u64>();
        (fixed, caps.iter().filter(|c| !c.1).map(|c| c.0).sum())
    }

    /// Fit the connection and process caps into `limit` open files. Caps
    /// set in the file are kept, and a start they cannot fit is refused;
    /// caps left at their defaults are lowered in proportion to fit (the
    /// returned text says to what).
    pub fn fit_fd_limit(&mut self, limit: u64) -> Result<Option<String>, ConfigError> {
        let need = self.fds_needed();
        self.fd_fit = Some(FdFit {
            limit,
            written: self.caps_in_force(),
            active_tenants: self.active_tenants_bound(),
        });
        if need <= limit {
            return Ok(None);
        }
        // Room for at least a few of each defaulted cap.
        let fits = |(fixed, flexible): (u64, u64)| flexible > 0 && limit >= fixed + 64;
        // Without a template, the configured tenants' cap is kept where
        // the other caps can make room (a reload may add tenants up to
        // it); where they cannot, a defaulted cap is lowered with them
        // (tenants past it wait for an idle one's place, as templated
        // ones do). One set in the file is always kept.
        let keep_tenants = self.template.is_none() && fits(self.fixed_and_flexible(true));
        let caps = self.fd_caps(keep_tenants);
        let (fixed, flexible) = self.fixed_and_flexible(keep_tenants);
        if !fits((fixed, flexible)) {
            return Err(ConfigError(self.fd_misfit(need, limit)));
        }
        let room = (limit - fixed) as f64 / flexible as f64;
        // Lowered caps round down, so the lowered ones take at most the
        // room; one that would go to 0 does not fit (lifting it to 1
        // would pass the limit).
        let e = self.caps_explicit;
        let lowered = |n: usize| (n as f64 * room) as usize;
        let too_low = caps
            .iter()
            .zip([
                "server.max_connections",
                "server.grpc_max_connections",
                "server.max_unauthenticated",
                "exec.max_processes",
                "server.max_active_tenants",
            ])
            .find(|((n, explicit), name)| {
                let n = if *name == "server.max_active_tenants" {
                    self.active_tenants_bound()
                } else {
                    *n as usize
                };
                !explicit && n > 0 && lowered(n) == 0
            });
        if let Some((_, name)) = too_low {
            return Err(ConfigError(format!(
                "{}; lowering the caps left at their defaults to fit would leave {name} at 0",
                self.fd_misfit(need, limit)
            )));
        }
        let scale = |n: usize, explicit: bool| if explicit { n } else { lowered(n).max(1) };
        self.max_connections = scale(self.max_connections, e.connections);
        self.grpc_max_connections = scale(self.grpc_max_connections, e.grpc);
        self.max_unauthenticated = scale(self.max_unauthenticated, e.unauthenticated);
        self.max_unauthenticated_per_source = self
            .max_unauthenticated_per_source
            .min(self.max_unauthenticated);
        self.max_processes = scale(self.max_processes, e.processes);
        if !e.active_tenants && !keep_tenants {
            self.max_active_tenants = scale(self.active_tenants_bound(), false);
        }
        let active = self.active_tenants_bound();
        if let Some(f) = &mut self.fd_fit {
            f.active_tenants = active;
        }
        let after = self.fds_needed();
        if after > limit {
            return Err(ConfigError(self.fd_misfit(after, limit)));
        }
        Ok(Some(format!(
            "RLIMIT_NOFILE is {limit}: caps left at their defaults lowered to fit: server.max_connections {}, server.grpc_max_connections {}, server.max_unauthenticated {}, exec.max_processes {}, server.max_active_tenants {}",
            self.max_connections,
            self.grpc_max_connections,
            self.max_unauthenticated,
            self.max_processes,
            self.max_active_tenants
        )))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::Config;
    use super::super::tests::minimal;

    fn fitted(extra: &str, limit: u64) -> Result<super::Settings, super::ConfigError> {
        let c: Config = toml::from_str(&minimal(extra)).unwrap();
        let mut s = c.validate()?;
        s.fit_fd_limit(limit)?;
        Ok(s)
    }

    /// A reload's tenants must fit beside the caps in force.
    #[test]
    fn a_reload_is_held_to_the_running_fit() {
        let mut running = fitted("", 20_000).unwrap();
        assert!(running.fds_needed() <= 20_000);
        // As the gateway keeps it: its tenants live in the registry.
        running.tenants = Default::default();
        let same = fitted("", 20_000).unwrap();
        running.check_reload_fit(&same).unwrap();
        assert_eq!(running.caps_as_written(), same.caps_as_written());
        let more = fitted("max_open_files = 9000\n", 20_000).unwrap();
        let e = running.check_reload_fit(&more).unwrap_err().0;
        assert!(e.contains("RLIMIT_NOFILE allows 20000"), "{e}");
    }

    /// A tenant cap no lowering makes room for refuses the start.
    #[test]
    fn a_tenant_cap_that_cannot_fit_is_refused() {
        let e = fitted("max_open_files = 1000000\n", 20_000).unwrap_err().0;
        assert!(e.contains("RLIMIT_NOFILE allows 20000"), "{e}");
    }
}
