//! exec-gateway: the Codex exec-server JSON-RPC protocol (and a gRPC API
//! with the same capabilities), served fast and bounded to many tenants at
//! once.
//!
//! # Layout
//!
//! Imports run one way, from the top of this list to the bottom
//! (`tests/layering.rs` checks it):
//!
//! - [`cli`]: the command line; parses, loads configuration, runs.
//! - [`client`]: a client of the gateway (websocket or gRPC, one API),
//!   which `exec`, `cp`, `ps` and the benchmark use.
//! - [`server`]: serves the doors and owns the shutdown order.
//! - [`transport`]: the doors (websocket, stdio, gRPC), the connection
//!   state machine, the fleet's peer link and relay, remote executors'
//!   routes, and the one authenticate function.
//! - [`forward`]: port forwarding: a TCP stream to a port on a session's
//!   own loopback, made inside its tenant's network namespace.
//! - [`gateway`]: the shared state of one gateway process.
//! - [`mcp`]: the MCP server: the gateway's capabilities as MCP tools, each
//!   MCP session one gateway session opened through a door's [`mcp::Door`].
//! - [`probe`]: what the host allows, each isolation layer probed by doing it.
//! - [`middleware`]: the tower stack, built in one function.
//! - [`dispatch`]: the innermost service; hands a call to its session's backend.
//! - [`session`]: sessions, detach TTL and resume.
//! - [`preview`]: preview URLs: routes, signed grants, a session's
//!   previewed ports, and the HTTP proxy into them.
//! - [`tenant`]: configured tenants, their limits and backends.
//! - [`backend`]: where a session runs: [`backend::local`] (the tenant's
//!   workers) or [`backend::remote`] (an executor of its pool).
//! - [`egress`]: egress by name: a tenant's resolver and proxy in its
//!   network namespace, deciding its connections out by host name.
//! - [`process`]: a session's processes: tables, output logs, pumps
//!   (spawning goes through [`spawn`]; tasks start through [`task`]).
//! - [`worker`]: per-tenant worker processes (link, client, the worker's main).
//! - [`registry`]: the registry remote executors join: pools, links,
//!   rendezvous tickets.
//! - [`snapshot`]: workspace snapshots and their forks (copy-on-write
//!   overlays of a snapshot's tree).
//! - [`image`]: OCI images: pulls, the shared content-addressed store,
//!   each tenant's view of its image as `/`.
//! - [`spawn`]: the one spawn model (spec, child, how it ended).
//! - [`isolation`]: cgroups, sandbox (uid, Landlock, seccomp), signals, reaper.
//! - [`rpc`]: the method table: typed calls, replies, stream operations.
//! - [`fleet`]: this replica's fleet identity: session ids that name their
//!   owner, peers, the fleet credential.
//! - [`tls`]: TLS for the listeners and the gateway's own dials (rustls),
//!   reloaded when its files change.
//! - [`auth`]: JWT verification (keys, JWKS) into a [`auth::Principal`].
//! - [`config`]: raw configuration validated into settings.
//! - below everything: [`fs`] (file operations on a confined root),
//!   [`outbound`] (bounded per-connection queues), [`protocol`] (wire types),
//!   [`error`] (the one error table), [`metrics`], [`audit`] (the audit
//!   trail), [`webhooks`] (lifecycle events, offered by [`audit`]),
//!   [`telemetry`], [`task`].

pub mod audit;
pub mod auth;
pub mod backend;
pub mod cli;
pub mod client;
pub mod config;
pub mod dispatch;
pub mod egress;
pub mod error;
pub mod fleet;
pub mod forward;
pub mod fs;
pub mod gateway;
pub mod image;
pub mod isolation;
pub mod mcp;
pub mod metrics;
pub mod middleware;
pub mod outbound;
pub mod preview;
pub mod probe;
pub mod process;
pub mod protocol;
pub mod registry;
pub mod rpc;
pub mod server;
pub mod session;
pub mod snapshot;
pub mod spawn;
pub mod task;
pub mod telemetry;
pub mod tenant;
pub mod tls;
pub mod transport;
pub mod webhooks;
pub mod worker;
