//! `http/request`: the session's HTTP, performed by the tenant's client
//! (`egress::http`, inside its network); a streamed body goes out as
//! `http/request/bodyDelta` after the response.

use std::sync::Arc;

use base64::Engine as _;

use super::LocalSession;
use crate::backend::RunScope;
use crate::error::GatewayError;
use crate::protocol::http::{BodyDelta, HttpRequestParams};
use crate::protocol::methods;
use crate::rpc::{Outcome, Reply};

/// Streamed responses one session reads at once.
pub const MAX_STREAMS_PER_SESSION: usize = 16;

pub(super) async fn request(
    s: &LocalSession,
    p: HttpRequestParams,
    scope: RunScope,
) -> Result<Outcome, GatewayError> {
    let Some(http) = s.shared.http.clone() else {
        return Err(super::http_disabled());
    };
    let id = p.request_id.clone();
    if p.stream_response {
        let mut active = s.http_streams.lock();
        if active.contains(&id) {
            return Err(GatewayError::InvalidParams(format!(
                "http/request streamResponse requestId `{id}` is already active"
            )));
        }
        if active.len() >= MAX_STREAMS_PER_SESSION {
            return Err(GatewayError::InvalidRequest(format!(
                "http/request: at most {MAX_STREAMS_PER_SESSION} streamed responses at once per session"
            )));
        }
        active.insert(id.clone());
    }
    let fetched = match http.fetch(&p).await {
        Ok(f) => f,
        Err(e) => {
            s.http_streams.lock().remove(&id);
            return Err(e);
        }
    };
    let mut head = fetched.head;
    if !p.stream_response {
        let body = crate::egress::http::read_all(fetched.body, fetched.deadline).await?;
        head.body_base64 = base64::engine::general_purpose::STANDARD.encode(&body);
        return Ok(Outcome::Reply(Reply::Http(head)));
    }
    let streams = s.http_streams.clone();
    let attachment = s.attachment.clone();
    let stop = s.http_stop.clone();
    let (mut body, deadline) = (fetched.body, fetched.deadline);
    let stream = async move {
        let mut pending = bytes::Bytes::new();
        let mut seq = 0u64;
        let error = loop {
            let next = tokio::select! {
                n = crate::egress::http::next_delta(&mut body, &mut pending, deadline) => n,
                () = stop.cancelled() => Err("the session ended".to_owned()),
            };
            match next {
                Ok(Some(chunk)) => {
                    seq += 1;
                    attachment
                        .notify(delta(&id, seq, &chunk, false, None))
                        .await;
                }
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        seq += 1;
        attachment.notify(delta(&id, seq, &[], true, error)).await;
        streams.lock().remove(&id);
    };
    let reply = Reply::Http(head);
    match scope.reply {
        // The response first, then its body.
        Some(to) => {
            let result = serde_json::to_string(&reply)
                .map_err(|e| GatewayError::Internal(format!("encoding a reply: {e}")))?;
            let held = to
                .outbound()
                .reserve(result.len() + 64)
                .await
                .map_err(|_| crate::backend::closed_before_reply())?;
            to.send_encoded(result, 0, held).await;
            crate::task::start("http-request-body", stream);
            Ok(Outcome::Sent)
        }
        None => {
            crate::task::start("http-request-body", stream);
            Ok(Outcome::Reply(reply))
        }
    }
}

/// One `http/request/bodyDelta` notification.
fn delta(id: &str, seq: u64, data: &[u8], done: bool, error: Option<String>) -> String {
    let params = BodyDelta {
        request_id: id.to_owned(),
        seq,
        delta_base64: base64::engine::general_purpose::STANDARD.encode(data),
        done,
        error,
    };
    serde_json::json!({ "method": methods::HTTP_REQUEST_BODY_DELTA, "params": params }).to_string()
}

/// The active streamed request ids of a session.
pub(super) type Streams = Arc<parking_lot::Mutex<std::collections::HashSet<String>>>;
