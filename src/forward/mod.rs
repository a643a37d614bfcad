//! Port forwarding (docs/forward.md): a raw TCP stream from a client to a
//! port on a session's own loopback, inside its tenant's network
//! namespace: never the host's, never another tenant's, never an
//! arbitrary host.
//!
//! - `connect`: the one way in. A thread of its own joins the tenant's
//!   network namespace (`setns`), connects to `127.0.0.1:PORT` there and
//!   ends; the socket stays in that namespace. A tenant without a
//!   namespace of its own (network `host`) has nothing to forward into.
//! - `pump`: the bytes both ways over a websocket (`GET
//!   /forward/{session}/{port}`), bounded: binary messages of at most
//!   [`MAX_CHUNK_BYTES`], an idle timeout ([`Activity`]), and
//!   [`MAX_FORWARDS_PER_TENANT`] streams at once per tenant.
//!
//! Its seam into the rest: both doors, the websocket one
//! (`transport::forward`) and gRPC's `ForwardPort`
//! (`transport::grpc::forward_port`), authenticate the caller and pass
//! the same checks (`transport::forward::admit`: the `forward` scope, the
//! caller tenant's session, its namespace, one of its streams), which
//! make the connection with [`connect`]; the websocket door hands it to
//! [`serve`], the gRPC one pumps it between its two streams.

mod connect;
mod pump;

use std::time::Duration;

pub use connect::connect;
pub use pump::{Activity, Moved, serve};

/// Streams one tenant may forward at once.
pub const MAX_FORWARDS_PER_TENANT: usize = 64;
/// A stream with no byte either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Most bytes of one websocket message either way.
pub const MAX_CHUNK_BYTES: usize = 64 << 10;
/// How long a connect inside the namespace may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `/forward/{session}/{port}`: the session and the port, if `path` is a
/// forward's (a port of 1 to 65535).
pub fn route(path: &str) -> Option<Result<(&str, u16), &'static str>> {
    let rest = path.strip_prefix("/forward/")?;
    let Some((session, port)) = rest.split_once('/') else {
        return Some(Err("expected /forward/{session}/{port}"));
    };
    if session.is_empty() || session.len() > 128 || session.contains('/') {
        return Some(Err("expected /forward/{session}/{port}"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !port.starts_with('0') && port.bytes().all(|b| b.is_ascii_digit()) => {
            Some(Ok((session, p)))
        }
        _ => Some(Err("the port must be 1 to 65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn a_forward_path_names_a_session_and_a_port() {
        assert_eq!(route("/forward/s-1/8080"), Some(Ok(("s-1", 8080))));
        assert_eq!(route("/"), None);
        assert_eq!(route("/forwarded"), None);
        for bad in [
            "/forward/s",
            "/forward//80",
            "/forward/s/0",
            "/forward/s/65536",
            "/forward/s/+80",
            "/forward/s/80/x",
            "/forward/s/ 80",
        ] {
            assert!(matches!(route(bad), Some(Err(_))), "{bad}");
        }
    }
}
