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
            return Err(ConfigError(format!(
                "connection, process and tenant caps need up to {need} open files (server.max_connections {} + server.grpc_max_connections {} + server.max_unauthenticated {} + {FDS_PER_PROCESS} x exec.max_processes {} + {} active tenants x {} for their workers, max_open_files and max_streams + {} reserved) but RLIMIT_NOFILE allows {limit}: lower them or raise the limit",
                self.max_connections,
                caps[1].0,
                self.max_unauthenticated,
                self.max_processes,
                self.active_tenants_bound(),
                self.fds_per_active_tenant(),
                self.reserved_fds()
            )));
        }
        let room = (limit - fixed) as f64 / flexible as f64;
        let scale = |n: usize, explicit: bool| {
            if explicit {
                n
            } else {
                ((n as f64 * room) as usize).max(1)
            }
        };
        let e = self.caps_explicit;
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
