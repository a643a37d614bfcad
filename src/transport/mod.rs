//! The doors: bytes in, typed operations through the stack, bytes out.
//!
//! - [`limits`]: connection limits and the handshake deadline, before and
//!   after a connection authenticates, the same for both doors;
//! - [`authenticate`]: a bearer token into a caller, the one function every
//!   door calls;
//! - [`connection`]: one JSON-RPC connection: its state machine
//!   (initialize, `initialized`, the initialize gate) and the driver that
//!   runs its calls concurrently and bounded, whatever carries it;
//! - [`ws`] (the listener, with [`http`] for health and the admin
//!   listener; each upgraded connection served by [`websocket`]) and
//!   [`stdio`]: the JSON-RPC doors; [`grpc`]: the gRPC door;
//! - [`fleet`]: the peer listener and websocket sessions relayed to the
//!   replica that owns them (plugged into the connection by the websocket
//!   door; gRPC calls are forwarded by `grpc::forward`);
//! - [`remote`]: remote executors: the registry's routes, and this binary
//!   as a remote executor dialling out to a registry.
//!
//! Nothing here runs a handler except through the stack (`initialize` and
//! `session/close`, which change what a connection holds, are the
//! documented exception in [`connection`]).
//!
//! Imports run one way inside this folder: the doors (`ws`, `stdio`,
//! `fleet::peer`) use `fleet::relay` and `connection`; `fleet::relay` uses
//! `connection`; `connection` knows neither.

pub mod authenticate;
pub mod connection;
pub mod fleet;
mod forward;
pub mod grpc;
pub mod http;
pub mod inbound;
pub mod limits;
pub mod mcp;
pub mod preview;
pub mod remote;
pub mod stdio;
pub mod websocket;
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
