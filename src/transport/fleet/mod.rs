//! The fleet's side of the doors (docs/fleet.md): [`peer`], the listener
//! where replicas reach the sessions they own for each other, and
//! [`relay`], websocket sessions carried to the replica that owns them.
//! (gRPC calls are forwarded by `transport::grpc::forward`; who owns a
//! session and the fleet credential are `crate::fleet`.)

pub mod peer;
pub mod relay;
