//! gRPC calls on sessions another replica owns (docs/fleet.md).
//!
//! After [`super::Authenticate`] has admitted the caller, a call to a
//! session-bearing method (every `ProcessService` method and
//! `SessionService/ResumeSession`/`CloseSession`, whose requests carry
//! `session_id` as field 1; every `FileService` method and
//! `EnvironmentService/GetInfo`, as field 15) is routed by the session id
//! in its first message. A session of
//! this replica goes on to the local services; one of another replica is
//! forwarded to it over the peer listener as the HTTP/2 request it is,
//! streaming bodies included, with the fleet credential added and the
//! client's `authorization` unchanged (the owner admits the client again).
//! The owner's response streams back untouched; if the owner goes away
//! mid-stream the call ends with `UNAVAILABLE` naming the replica.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::StreamExt as _;
use http_body_util::{BodyExt as _, BodyStream, StreamBody};
use hyper::http;
use tonic::body::Body;
use tower::ServiceExt as _;

use crate::error::GatewayError;
use crate::fleet::{CLIENT_ADDR_HEADER, CREDENTIAL_HEADER, Owner};
use crate::gateway::{Gateway, RelayGuard};
use crate::transport::limits::ConnInfo;

/// Longest prefix of a first message read to find its session id: the id
/// is short and encoders write field 1 first, but the scan is correct in
/// any field order up to this.
const MAX_PEEK_BYTES: usize = super::MAX_GRPC_MESSAGE_BYTES;

/// The field of a method's request that holds `string session_id`.
fn session_field(path: &str) -> Option<u64> {
    if path.starts_with("/exec_gateway.v1.ProcessService/")
        || path == "/exec_gateway.v1.SessionService/ResumeSession"
        || path == "/exec_gateway.v1.SessionService/CloseSession"
        || path == "/exec_gateway.v1.SessionService/CreatePreview"
        || path == "/exec_gateway.v1.SessionService/RevokePreview"
        || path == "/exec_gateway.v1.SessionService/ListPreviews"
    {
        Some(1)
    } else if path.starts_with("/exec_gateway.v1.FileService/")
        || path == "/exec_gateway.v1.EnvironmentService/GetInfo"
    {
        Some(15)
    } else {
        None
    }
}

#[derive(Clone)]
pub struct ForwardLayer {
    gw: Arc<Gateway>,
}

impl ForwardLayer {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }
}

impl<S> tower::Layer<S> for ForwardLayer {
    type Service = Forward<S>;
    fn layer(&self, inner: S) -> Forward<S> {
        Forward {
            inner,
            gw: self.gw.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Forward<S> {
    inner: S,
    gw: Arc<Gateway>,
}

impl<S> tower::Service<http::Request<Body>> for Forward<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let field = match session_field(req.uri().path()) {
            Some(f) if self.gw.fleet.is_some() => f,
            _ => return Box::pin(inner.call(req)),
        };
        let gw = self.gw.clone();
        Box::pin(async move {
            let (parts, mut body) = req.into_parts();
            let (seen, session) = match peek_session(&mut body, field).await {
                Ok(v) => v,
                Err(status) => return Ok(status.into_http()),
            };
            let replay =
                futures_util::stream::iter(seen.into_iter().map(Ok)).chain(BodyStream::new(body));
            let body = Body::new(StreamBody::new(replay));
            if let Some(s) = &session
                && let Err(e) = crate::rpc::check_id_length("session_id", s)
            {
                return Ok(e.to_grpc().into_http());
            }
            let owner = session.as_deref().map_or(Owner::Local, |s| gw.owner(s));
            match owner {
                Owner::Local => inner.call(http::Request::from_parts(parts, body)).await,
                Owner::Restarted(r) => Ok(GatewayError::OwnerLost {
                    session: session.clone().unwrap_or_default(),
                    replica: r.to_owned(),
                }
                .to_grpc()
                .into_http()),
                Owner::Peer(r) => {
                    let session = session.clone().unwrap_or_default();
                    let replica = r.to_owned();
                    Ok(forward(&gw, parts, body, &session, &replica)
                        .await
                        .unwrap_or_else(|e| e.to_grpc().into_http()))
                }
            }
        })
    }
}

/// Send the call to `replica` and stream its answer back.
async fn forward(
    gw: &Arc<Gateway>,
    mut parts: http::request::Parts,
    body: Body,
    session: &str,
    replica: &str,
) -> Result<http::Response<Body>, GatewayError> {
    let unavailable = |detail: String| GatewayError::OwnerUnavailable {
        session: session.to_owned(),
        replica: replica.to_owned(),
        detail,
    };
    let fleet = gw
        .fleet
        .as_ref()
        .ok_or_else(|| unavailable("not in a fleet".to_owned()))?;
    let channel = fleet.channel(session, replica)?;
    let credential = http::HeaderValue::from_str(&fleet.credential(replica)?)
        .map_err(|_| GatewayError::Internal("unencodable fleet credential".to_owned()))?;
    parts.headers.insert(CREDENTIAL_HEADER, credential);
    let client = parts
        .extensions
        .get::<ConnInfo>()
        .and_then(|c| c.remote)
        .and_then(|a| http::HeaderValue::from_str(&a.to_string()).ok());
    match client {
        Some(v) => parts.headers.insert(CLIENT_ADDR_HEADER, v),
        None => parts.headers.remove(CLIENT_ADDR_HEADER),
    };
    // The owner continues this replica's span of the call (the client's
    // trace, when it sent one).
    if let Some(t) = crate::telemetry::context_of(&tracing::Span::current()) {
        if let Ok(v) = http::HeaderValue::from_str(&t.traceparent) {
            parts.headers.insert("traceparent", v);
        }
        match t
            .tracestate
            .and_then(|s| http::HeaderValue::from_str(&s).ok())
        {
            Some(v) => parts.headers.insert("tracestate", v),
            None => parts.headers.remove("tracestate"),
        };
    }
    parts.extensions = http::Extensions::new();
    let guard = gw.relay_guard();
    let req = http::Request::from_parts(parts, body);
    let response = tokio::time::timeout(fleet.dial_timeout * 2, channel.oneshot(req))
        .await
        .map_err(|_| unavailable("timed out".to_owned()))?
        .map_err(|e| unavailable(error_chain(&e)))?;
    let (parts, body) = response.into_parts();
    let lost = GatewayError::OwnerUnavailable {
        session: session.to_owned(),
        replica: replica.to_owned(),
        detail: "the connection to it was lost".to_owned(),
    }
    .to_grpc();
    let body = OwnerBody {
        inner: body,
        lost: Some(lost),
        _guard: guard,
    };
    Ok(http::Response::from_parts(parts, Body::new(body)))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// The owner's response body; a transport error becomes `UNAVAILABLE`
/// trailers naming the owner instead of a reset stream.
struct OwnerBody {
    inner: Body,
    lost: Option<tonic::Status>,
    _guard: RelayGuard,
}

impl http_body::Body for OwnerBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        if self.lost.is_none() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(_))) => {
                let Some(status) = self.lost.take() else {
                    return Poll::Ready(None);
                };
                let mut trailers = http::HeaderMap::new();
                let headers = status.into_http::<Body>().into_parts().0.headers;
                for (k, v) in &headers {
                    if k.as_str().starts_with("grpc-") || k.as_str().starts_with("x-exec-gateway") {
                        trailers.insert(k.clone(), v.clone());
                    }
                }
                Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.lost.is_none() || self.inner.is_end_stream()
    }
}

/// Read the body until the first message's `session_id` (`field`) is
/// known. Returns the frames read (to be replayed) and the id, if any.
async fn peek_session(
    body: &mut Body,
    field: u64,
) -> Result<(Vec<http_body::Frame<Bytes>>, Option<String>), tonic::Status> {
    let mut frames = Vec::new();
    let mut buf = BytesMut::new();
    loop {
        match scan(&buf, field) {
            Scan::Found(id) => return Ok((frames, id)),
            Scan::NeedMore if buf.len() < MAX_PEEK_BYTES + 5 => {}
            Scan::NeedMore => return Ok((frames, None)),
        }
        match body.frame().await {
            None => return Ok((frames, None)),
            Some(Err(status)) => return Err(status),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
                frames.push(frame);
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// The first message is read far enough: its session id, if any.
    Found(Option<String>),
    NeedMore,
}

/// Find `wanted` (a length-delimited field) in the gRPC frame at the
/// start of `buf`.
fn scan(buf: &[u8], wanted: u64) -> Scan {
    if buf.len() < 5 {
        return Scan::NeedMore;
    }
    if buf[0] != 0 {
        // Compressed: not ours to read; the local service answers.
        return Scan::Found(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    let available = &buf[5..];
    let complete = available.len() >= len;
    let mut msg = &available[..available.len().min(len)];
    let need_more = if complete {
        Scan::Found(None)
    } else {
        Scan::NeedMore
    };
    while msg.has_remaining() {
        let Some(key) = varint(&mut msg) else {
            return need_more;
        };
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                if varint(&mut msg).is_none() {
                    return need_more;
                }
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if msg.remaining() < n {
                    return need_more;
                }
                msg.advance(n);
            }
            2 => {
                let Some(n) = varint(&mut msg) else {
                    return need_more;
                };
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if msg.remaining() < n {
                    return need_more;
                }
                if field == wanted {
                    return Scan::Found(std::str::from_utf8(&msg[..n]).ok().map(str::to_owned));
                }
                msg.advance(n);
            }
            // Groups or garbage: let the service's decoder say so.
            _ => return Scan::Found(None),
        }
    }
    need_more
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.first()?;
        *buf = &buf[1..];
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(msg: &impl prost::Message) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut v = vec![0];
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }

    #[test]
    fn the_session_id_is_found_in_any_prefix_long_enough() {
        let req = super::super::pb::WriteRequest {
            session_id: "gw-1.0a0b0c0d.x".to_owned(),
            process_id: "p".to_owned(),
            data: vec![7u8; 100_000].into(),
            ..Default::default()
        };
        let f = frame(&req);
        for cut in [0, 3, 5, 6, 8] {
            assert_eq!(scan(&f[..cut], 1), Scan::NeedMore, "{cut}");
        }
        assert_eq!(
            scan(&f[..30], 1),
            Scan::Found(Some("gw-1.0a0b0c0d.x".to_owned()))
        );
        let exec = super::super::pb::ExecRequest::default();
        assert_eq!(scan(&frame(&exec), 1), Scan::Found(None));
    }

    #[test]
    fn a_file_call_is_routed_by_its_field_15_after_its_data() {
        let req = super::super::pb::WriteFileRequest {
            path: "/srv/x".to_owned(),
            data: vec![7u8; 70_000].into(),
            session_id: "gw-2.0a0b0c0d.y".to_owned(),
        };
        let f = frame(&req);
        assert_eq!(scan(&f[..f.len() - 1], 15), Scan::NeedMore);
        assert_eq!(
            scan(&f, 15),
            Scan::Found(Some("gw-2.0a0b0c0d.y".to_owned()))
        );
        let sessionless = super::super::pb::GetMetadataRequest {
            path: "/srv/x".to_owned(),
            ..Default::default()
        };
        assert_eq!(scan(&frame(&sessionless), 15), Scan::Found(None));
        assert_eq!(
            session_field("/exec_gateway.v1.FileService/WriteFile"),
            Some(15)
        );
    }
}
