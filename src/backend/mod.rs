//! Where a session runs: the seam between the stack and the machinery.
//!
//! The innermost service (module `dispatch`) hands every operation to the
//! [`SessionBackend`] of its session, or, for the few operations that need
//! no session (gRPC file calls), to the tenant's [`Backend`]. Doors and the
//! tower stack never know which backend serves a session.
//!
//! A tenant's [`local`] backend is its own worker pool (or the gateway
//! itself with workers off); a tenant with an executor pool also has a
//! [`remote`] one, whose sessions run on an executor's link. The session
//! registry picks between them by the tenant's placement.

pub mod local;
pub mod remote;
mod translate;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::outbound::{Attachment, Responder};
use crate::protocol::environment::EnvironmentInfo;
use crate::protocol::revision::RevisionCell;
use crate::rpc::{Op, Outcome};

/// The error when a reply's connection closed before the reply was sent.
pub fn closed_before_reply() -> GatewayError {
    GatewayError::Internal("the connection closed before the reply was sent".to_owned())
}

/// A boxed, sendable future of an operation's outcome.
pub type OpFuture = Pin<Box<dyn Future<Output = Result<Outcome, GatewayError>> + Send>>;

/// Where a new session's processes and files are: the image they see as
/// `/` (none: the tenant's default), the reference it was chosen by, and
/// the workspace of a fork (none: the tenant's root).
#[derive(Default, Clone)]
pub struct Place {
    pub view: Option<Arc<crate::image::View>>,
    pub image: Option<String>,
    pub workspace: Option<Arc<crate::snapshot::Workspace>>,
}

/// A tenant's backend: opens sessions and serves session-less operations.
pub trait Backend: Send + Sync {
    /// The runtime of a new session, whose notifications go to
    /// `attachment` and whose client speaks `revision` (once known); its
    /// processes and files are at `place`.
    fn open_session(
        &self,
        attachment: Arc<Attachment>,
        revision: Arc<RevisionCell>,
        place: Place,
    ) -> Result<Arc<dyn SessionBackend>, GatewayError>;

    /// Run an operation that belongs to no session.
    fn run_sessionless(&self, op: Op) -> OpFuture;

    /// Stop everything the backend runs (shutdown; sessions are gone).
    fn retire(&self);
}

/// What a session's operation runs with besides itself.
#[derive(Debug, Clone, Default)]
pub struct RunScope {
    /// Cancelled when another connection takes the session over (a
    /// long-poll then ends).
    pub evicted: CancellationToken,
    /// Where the reply goes, when the door hands one over (JSON-RPC):
    /// large replies reserve their bytes there before they are built, and
    /// are sent by the handler ([`crate::rpc::Outcome::Sent`]).
    pub reply: Option<Responder>,
    /// Whose call it is, when the audit trail is on (process exits name it).
    pub audit: Option<Arc<crate::audit::Tag>>,
}

/// One session's runtime.
pub trait SessionBackend: Send + Sync {
    /// Run an operation.
    fn run(self: Arc<Self>, op: Op, scope: RunScope) -> OpFuture;

    /// Kill every process of the session (session end, shutdown).
    fn kill_all(&self, why: crate::audit::KilledBy);

    /// Processes that have not closed yet.
    fn live_processes(&self) -> usize;

    /// Processes closed whose close no client has had yet (a draining
    /// gateway waits for them while a client is attached).
    fn undelivered_closes(&self) -> usize {
        0
    }

    /// Of the undelivered closes, those a websocket close handshake would
    /// not deliver (their client reads with `process/read`, or the close
    /// notification is not queued yet): while there are none, a draining
    /// gateway closes the client's connection to learn it has them all.
    fn closes_awaiting_read(&self) -> usize {
        0
    }

    /// What the session's commands run in (`initialize`, `environment/info`),
    /// paths as `file://` URIs.
    fn environment(&self) -> EnvironmentInfo;

    /// Run a call that belongs to no session in this session's place, as
    /// the tenant's [`Backend::run_sessionless`] runs it on the tenant's:
    /// gRPC file calls naming a session that runs its own image. Only
    /// local sessions have such a place.
    fn run_sessionless(&self, _op: Op) -> OpFuture {
        Box::pin(async {
            Err(GatewayError::Internal(
                "this session has no place of its own for calls without a session".to_owned(),
            ))
        })
    }

    /// Whether it runs on a remote executor (whose files are its own).
    fn is_remote(&self) -> bool {
        false
    }
}
