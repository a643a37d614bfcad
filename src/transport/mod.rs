//! The doors: bytes in, typed operations through the stack, bytes out.
//!
//! - [`admission`]: connection caps and the handshake deadline, before and
//!   after a connection authenticates, the same for both doors;
//! - [`admit`]: authenticate-and-admit, the one function every door calls;
//! - [`connection`]: one JSON-RPC connection's state machine (initialize,
//!   `initialized`, concurrent bounded requests), whatever carries it;
//! - [`ws`] (with [`http`] for health, and the admin listener) and [`stdio`]: the
//!   JSON-RPC doors; [`grpc`]: the gRPC door;
//! - [`peer`] and [`relay`]: the fleet's peer listener, and websocket
//!   sessions relayed to the replica that owns them (gRPC calls are
//!   forwarded by `grpc::forward`).
//! - [`registry`]: the executor registry's routes (registration, the
//!   rendezvous an executor's link is upgraded from); [`executor`]: this
//!   binary as a remote executor, dialling out to a registry.
//!
//! Nothing here runs a handler except through the stack.

pub mod admission;
pub mod admit;
pub mod connection;
pub mod executor;
pub mod grpc;
pub mod http;
pub mod peer;
pub mod registry;
pub mod relay;
pub mod stdio;
pub mod ws;

/// The next connection on `listener`, or `None` once the gateway stops.
/// A failed accept (EMFILE and friends) is logged and retried after a short
/// pause instead of spinning.
pub async fn next_connection(
    listener: &tokio::net::TcpListener,
    gw: &crate::gateway::Gateway,
    what: &'static str,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = gw.stopped() => return None,
        };
        match accepted {
            Ok(v) => return Some(v),
            Err(e) => {
                tracing::warn!(error = %e, listener = what, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
