//! The doors: bytes in, typed operations through the stack, bytes out.
//!
//! - [`admission`]: connection caps and the handshake deadline, before and
//!   after a connection authenticates, the same for both doors;
//! - [`admit`]: authenticate-and-admit, the one function every door calls;
//! - [`connection`]: one JSON-RPC connection's state machine (initialize,
//!   `initialized`, concurrent bounded requests), whatever carries it;
//! - [`ws`] (with [`http`] for health, and the admin listener) and [`stdio`]: the
//!   JSON-RPC doors; [`grpc`]: the gRPC door.
//!
//! Nothing here runs a handler except through the stack.

pub mod admission;
pub mod admit;
pub mod connection;
pub mod grpc;
pub mod http;
pub mod stdio;
pub mod ws;
