//! exec-gateway: the Codex exec-server JSON-RPC protocol, served fast and
//! bounded, for many clients at once.
//!
//! # Layout
//! - [`protocol`]: wire types (serde, camelCase), method names, the envelope.
//! - [`rpc`]: the typed [`rpc::Call`] every door decodes into, and [`rpc::Reply`].
//! - [`error`]: [`error::GatewayError`] and the one table of wire codes.
//! - [`auth`]: JWT verification (keys, JWKS) into a [`auth::Principal`].
//! - [`tenant`]: configured tenants with their roots, limits and quotas.
//! - [`middleware`]: the tower stack, built in one function.
//! - [`metrics`]: every Prometheus family.
//! - [`dispatch`]: the innermost service; runs a call on a session.
//! - [`session`]: sessions, detach TTL and resume.
//! - [`exec`]: process tables, spawning (pipes, PTYs), output logs, signals.
//! - [`fs`]: filesystem handlers over the host or a confined root (cap-std).
//! - [`outbound`]: bounded per-connection queues and session attachment.
//! - [`transport`]: websocket (+HTTP health/metrics) and stdio doors.
//! - [`gateway`]: wiring and the shutdown order.
//! - [`config`], [`cli`], [`telemetry`], [`task`], [`bench`].

pub mod auth;
pub mod bench;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod error;
pub mod exec;
pub mod fs;
pub mod gateway;
pub mod metrics;
pub mod middleware;
pub mod outbound;
pub mod protocol;
pub mod rpc;
pub mod session;
pub mod task;
pub mod telemetry;
pub mod tenant;
pub mod transport;
