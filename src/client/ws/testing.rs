//! A stand-in gateway for the websocket backend's unit tests: it reads
//! each frame the client sends with the server's own decoder
//! (`protocol::jsonrpc::decode`), answers with the server's own encoders,
//! and hands the answer to the link's real dispatch, so requests, id
//! matching and notifications go through the client's framing code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::super::types::ConnectOptions;
use super::WsClient;
use super::link::{Link, dispatch};
use super::mailbox::Subs;
use crate::protocol::jsonrpc::{self, ErrorObject, Inbound};
use crate::protocol::revision::Revision;

/// How the stand-in answers a request: its result or its error.
pub(super) type Answer = std::result::Result<Value, ErrorObject>;

pub(super) struct Fake {
    pub(super) client: WsClient,
    /// Each request and notification the client sent: method, params
    /// (`null` when absent) and the frame as sent.
    pub(super) seen: Arc<Mutex<Vec<(String, Value, String)>>>,
    pub(super) link: Arc<Link>,
    pub(super) subs: Arc<Subs>,
}

impl Fake {
    /// Methods of what the client sent, in order.
    pub(super) fn methods(&self) -> Vec<String> {
        self.seen.lock().iter().map(|(m, _, _)| m.clone()).collect()
    }

    /// Params of the `n`th request or notification.
    pub(super) fn params(&self, n: usize) -> Value {
        self.seen.lock()[n].1.clone()
    }

    /// Send a notification from the "gateway".
    pub(super) async fn notify(&self, method: &str, params: Value) {
        let text = jsonrpc::encode_notification(method, &params);
        dispatch(&text, &self.link.pending, &self.subs).await;
    }
}

pub(super) fn error(code: i64, message: &str) -> ErrorObject {
    ErrorObject {
        code,
        message: message.to_owned(),
        data: None,
    }
}

/// A client on a stand-in gateway that answers with `answer`.
pub(super) fn fake<F>(revision: Revision, answer: F) -> Fake
where
    F: Fn(&str, &Value) -> Answer + Send + Sync + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Message>(64);
    let link = Arc::new(Link::new(0, tx));
    let subs = Arc::new(Subs::default());
    let seen: Arc<Mutex<Vec<(String, Value, String)>>> = Arc::default();
    {
        let (link, subs, seen) = (link.clone(), subs.clone(), seen.clone());
        crate::task::start("client-test-gateway", async move {
            while let Some(m) = rx.recv().await {
                let Message::Text(text) = m else { continue };
                let text = text.as_str();
                match jsonrpc::decode(text).expect("the server reads every frame") {
                    Inbound::Request { id, method, params } => {
                        let params: Value = params
                            .map(|p| serde_json::from_str(p.get()).unwrap())
                            .unwrap_or(Value::Null);
                        seen.lock()
                            .push((method.clone(), params.clone(), text.to_owned()));
                        let reply = match answer(&method, &params) {
                            Ok(v) => jsonrpc::encode_response(&id, &v),
                            Err(e) => jsonrpc::encode_error(&id, &e),
                        };
                        dispatch(&reply, &link.pending, &subs).await;
                    }
                    Inbound::Notification { method, bad_id } => {
                        assert!(!bad_id);
                        seen.lock().push((method, Value::Null, text.to_owned()));
                    }
                    Inbound::ClientResponse { .. } => panic!("the client answered: {text}"),
                }
            }
        });
    }
    let client = WsClient::new(
        ConnectOptions::new("ws://fake", "token"),
        "s1".to_owned(),
        "/".to_owned(),
        revision,
        link.clone(),
        subs.clone(),
        AtomicI64::new(1),
    );
    Fake {
        client,
        seen,
        link,
        subs,
    }
}
