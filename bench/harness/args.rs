//! The command line: which figures run, and their sizes.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Parser)]
#[command(
    name = "exec-gateway-bench",
    about = "Measure exec-gateway against direct baselines"
)]
pub struct BenchArgs {
    /// The gateway binary (default: `exec-gateway` next to this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
    /// Also measure the reference: path to the `codex` binary
    /// (run as `codex exec-server --listen ws://127.0.0.1:0`).
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Iterations for latency figures.
    #[arg(long, default_value_t = 1000)]
    pub iterations: usize,
    /// Idle sessions for the memory figure.
    #[arg(long, default_value_t = 10_000)]
    pub sessions: usize,
    /// Bytes of output for the throughput figure.
    #[arg(long, default_value_t = 1 << 30)]
    pub output_bytes: u64,
    /// Seconds per spawns-per-second run.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Run the soak instead of the figures: victims next to an abusive
    /// tenant and idle unauthenticated sockets for this long (e.g. `10m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub soak: Option<Duration>,
    /// The soak's first phase, victims alone (their baseline).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub soak_baseline: Duration,
    /// With `--soak`: the reliability soak instead (a mixed workload on both
    /// doors in several tenants, chaos on a schedule, every outcome
    /// classified; exits non-zero on any unexpected failure).
    #[arg(long)]
    pub reliability: bool,
    /// Reliability soak: 1 gateway, or 3 replicas behind HAProxy.
    #[arg(long, default_value_t = 1)]
    pub soak_replicas: usize,
    /// Reliability soak: the chaos to run, in turn (worker, cut, stall,
    /// replica, drain; default: all that apply).
    #[arg(long, value_delimiter = ',')]
    pub soak_chaos: Option<Vec<String>>,
    /// Reliability soak: time between two acts of chaos.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub soak_interval: Duration,
    /// Only the fleet figures (relayed vs owner).
    #[arg(long)]
    pub fleet_only: bool,
    /// Only the remote-executor figures (executor vs local worker).
    #[arg(long)]
    pub executors_only: bool,
    /// Only the production edges' cost: TLS, the audit trail, tracing,
    /// each on against off.
    #[arg(long)]
    pub edges_only: bool,
    /// Only the memory figure (RSS per idle session).
    #[arg(long)]
    pub memory_only: bool,
    /// Only the websocket output figures (lean and parsing clients
    /// against a direct pipe).
    #[arg(long)]
    pub output_only: bool,
    /// Only the `fs/readFile` figures (lean and parsing clients against
    /// read + base64 in this process).
    #[arg(long)]
    pub files_only: bool,
    /// Only the image figures (cold tenants with a cached image, the
    /// 100 MiB pull against skopeo, the store's size).
    #[arg(long)]
    pub images_only: bool,
    /// Only the snapshot figures (a 1 GiB workspace snapshotted against
    /// `tar | sha256sum`, forked into 8 sessions against `cp -a`, pushed
    /// to a local registry and restored on a second gateway against
    /// `skopeo copy`).
    #[arg(long)]
    pub snapshots_only: bool,
    /// Only the preview and port-forward figures (nginx inside a tenant
    /// through a path preview and `port-forward`, against the same nginx
    /// reached directly).
    #[arg(long)]
    pub previews_only: bool,
    /// Only the tenant-scale figures (start-up with many tenants, idle
    /// and cold tenants, many tenants with a live session).
    #[arg(long)]
    pub tenants_only: bool,
    /// Only the start figures: cold tenants against a warm one, and a warm
    /// tenant's spawns after a quiet spell (what the VM lane measures).
    #[arg(long)]
    pub cold_only: bool,
    /// Samples of each start figure with `--cold-only`.
    #[arg(long, default_value_t = 30)]
    pub cold_samples: usize,
    /// Configured tenants for the start-up and idle-memory figures.
    #[arg(long, default_value_t = 10_000)]
    pub tenant_count: usize,
    /// Tenants holding one live session each.
    #[arg(long, default_value_t = 1000)]
    pub live_tenants: usize,
    /// Only a reliability count: this many `true` spawns over 8
    /// connections in a tenant with every isolation layer at its default
    /// (a root of its own), every failure counted by its error.
    #[arg(long)]
    pub spawns: Option<u64>,
    /// Print the figures as one JSON array (figure, ours, baseline, ratio,
    /// target, met, reference, and the leading numbers as `ours_value` and
    /// `baseline_value`) instead of the table, to compare commits.
    #[arg(long)]
    pub json: bool,
    /// Internal: the soak's abuser process.
    #[arg(long, hide = true)]
    pub soak_abuser: Option<String>,
}
