//! The JSON-RPC envelope as the reference speaks it (docs/protocol.md,
//! "Envelope").
//!
//! Decoding mirrors the reference's untagged enum (Request → Notification →
//! Response → Error) without materialising a `serde_json::Value`: params stay a
//! borrowed `RawValue` until the method is known, so a multi-megabyte
//! `fs/writeFile` is parsed once. Output never carries `"jsonrpc"`; input may.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Request id: an i64 or a string, echoed verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    Integer(i64),
    String(String),
}

impl RequestId {
    /// The id the reference uses for errors that belong to no request.
    pub const UNKNOWN: RequestId = RequestId::Integer(-1);
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Integer(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// One decoded inbound message.
#[derive(Debug)]
pub enum Inbound<'a> {
    Request {
        id: RequestId,
        method: String,
        params: Option<&'a RawValue>,
    },
    Notification {
        method: String,
        /// An `id` was present but is not an integer or a string (null,
        /// fractional): 0.130.0 reads such a frame as a notification,
        /// 0.169.0 refuses it.
        bad_id: bool,
    },
    /// A response or error sent by the client: to a request the gateway
    /// sent (`network/policyRequest`) when its id is one, else ignored.
    ClientResponse {
        /// The id, when it is a non-negative integer (the gateway's ids are).
        id: Option<u64>,
        /// The `result`, as sent; `None` for an error.
        result: Option<String>,
    },
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    /// `Some` whenever the key is present, `null` included (a plain
    /// `Option` would read `"id":null` as absent).
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<String>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Why a frame could not be decoded; the text follows serde's wording.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MalformedMessage {
    /// Not JSON at all (serde's text).
    #[error("{0}")]
    Json(String),
    /// Valid JSON that is not an object (a batch, a number...).
    #[error("{NO_VARIANT}")]
    NotAnObject,
    /// An object that is neither a request, a notification nor a response;
    /// the text 0.169.0 gives for it (it decodes such an object as an error
    /// response, or as a response when it has `result`).
    #[error("{NO_VARIANT}")]
    NoVariant { current: &'static str },
}

impl MalformedMessage {
    /// The text 0.169.0 gives for the same frame ("expected a JSON-RPC
    /// object" for a non-object; otherwise as 0.130.0).
    pub fn current_text(&self) -> String {
        match self {
            MalformedMessage::NotAnObject => "expected a JSON-RPC object".to_owned(),
            MalformedMessage::NoVariant { current } => (*current).to_owned(),
            other => other.to_string(),
        }
    }
}

/// Spaces a large encoded `result` starts with, so its connection writes
/// the response's head (`{"id":…,"result":`) over them instead of copying
/// the whole result into a new string: whitespace between JSON tokens, so
/// the message is the same JSON to every parser.
pub const ENVELOPE_GAP: usize = 48;

/// The bad-id message of 0.169.0.
pub const BAD_REQUEST_ID: &str = "data did not match any variant of untagged enum RequestId";

const NO_VARIANT: &str = "data did not match any variant of untagged enum JSONRPCMessage";

/// Decode one frame or line into an [`Inbound`].
pub fn decode(text: &str) -> Result<Inbound<'_>, MalformedMessage> {
    // serde derives accept arrays for structs (positional fields); the
    // reference's untagged enum does not, so a batch is malformed.
    if !text.trim_start().starts_with('{') {
        return match serde_json::from_str::<&RawValue>(text) {
            Err(e) => Err(MalformedMessage::Json(e.to_string())),
            Ok(_) => Err(MalformedMessage::NotAnObject),
        };
    }
    let raw: RawMessage<'_> =
        serde_json::from_str(text).map_err(|e| MalformedMessage::Json(e.to_string()))?;
    check_escapes(text)?;
    let id = raw.id.and_then(parse_id);
    let bad_id = raw.id.is_some() && id.is_none();
    match (raw.method, id) {
        (Some(method), Some(id)) => Ok(Inbound::Request {
            id,
            method,
            params: raw.params,
        }),
        // An id that is null, fractional or of another type does not match
        // Request; the reference then decodes the frame as a notification.
        (Some(method), None) => Ok(Inbound::Notification {
            method,
            bad_id: raw.id.is_some(),
        }),
        (None, _) if raw.id.is_some() && (raw.result.is_some() || raw.error.is_some()) => {
            Ok(Inbound::ClientResponse {
                id: raw.id.and_then(|v| v.get().parse::<u64>().ok()),
                result: match raw.error {
                    Some(_) => None,
                    None => raw.result.map(|r| r.get().to_owned()),
                },
            })
        }
        (None, _) => Err(MalformedMessage::NoVariant {
            current: if bad_id {
                BAD_REQUEST_ID
            } else if raw.result.is_some() || raw.error.is_some() {
                "missing field `id`"
            } else {
                "missing field `error`"
            },
        }),
    }
}

/// 0.169.0 decodes every string of a frame, wherever it is (the envelope,
/// params, an unknown member), and refuses an escape that makes no string,
/// such as a lone UTF-16 surrogate (`"\ud800"`), with serde_json's
/// text and position; borrowed `RawValue`s skip that check. A frame with a
/// `\u` escape (never in base64 payloads, so rarely paid for) is read
/// through once more as values to find such an escape.
fn check_escapes(text: &str) -> Result<(), MalformedMessage> {
    if !text.contains("\\u") {
        return Ok(());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Err(e) if e.is_syntax() => Err(MalformedMessage::Json(e.to_string())),
        _ => Ok(()),
    }
}

/// The envelope's `trace` (`{"traceparent", "tracestate"}`), when well
/// formed: a malformed one is ignored, as the reference ignores it.
pub fn trace_of(text: &str) -> Option<crate::telemetry::TraceContext> {
    #[derive(Deserialize)]
    struct Trace<'a> {
        #[serde(borrow)]
        traceparent: Option<&'a str>,
        #[serde(borrow)]
        tracestate: Option<&'a str>,
    }
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        trace: Option<Trace<'a>>,
    }
    let e: Envelope<'_> = serde_json::from_str(text).ok()?;
    let t = e.trace?;
    crate::telemetry::TraceContext::parse(t.traceparent?, t.tracestate)
}

fn present<'de, D>(d: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    <&RawValue as serde::Deserialize>::deserialize(d).map(Some)
}

fn parse_id(raw: &RawValue) -> Option<RequestId> {
    serde_json::from_str::<RequestId>(raw.get()).ok()
}

/// Decode `params` the way the reference's `decode_params` does: missing is
/// `null`, `{}` falls back to `null` for unit-like params, arrays decode
/// positionally, unknown fields are ignored. The error text has no position.
pub fn decode_params<T: serde::de::DeserializeOwned>(
    params: Option<&RawValue>,
) -> Result<T, String> {
    let text = params.map_or("null", RawValue::get);
    match serde_json::from_str::<T>(text) {
        Ok(v) => Ok(v),
        Err(e) => {
            if text.trim() == "{}"
                && let Ok(v) = serde_json::from_str::<T>("null")
            {
                return Ok(v);
            }
            // The error path only: decode once more from a `Value`, as the
            // reference does, for its exact wording (a few messages differ
            // between the two serde_json paths, e.g. enums given a map).
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(text)
                && let Err(e) = serde_json::from_value::<T>(value)
            {
                return Err(e.to_string());
            }
            Err(strip_position(&e))
        }
    }
}

/// serde_json appends " at line L column C" when decoding from text; the
/// reference decodes from a `Value` and has no position, so drop it.
pub fn strip_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.line() == 0 {
        return text;
    }
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix)
        .map(str::to_owned)
        .unwrap_or(text)
}

/// Error object of a JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: i64,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub data: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct ResponseOut<'a, T: Serialize> {
    id: &'a RequestId,
    result: &'a T,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    error: &'a ErrorObject,
    id: &'a RequestId,
}

#[derive(Serialize)]
struct NotificationOut<'a, T: Serialize> {
    method: &'a str,
    params: &'a T,
}

/// Serialise a response. Serialising our own types cannot fail; if it ever
/// did, the client gets an internal error rather than silence.
pub fn encode_response<T: Serialize>(id: &RequestId, result: &T) -> String {
    serde_json::to_string(&ResponseOut { id, result }).unwrap_or_else(|e| {
        encode_error(
            id,
            &ErrorObject {
                code: -32603,
                message: format!("failed to encode response: {e}"),
                data: None,
            },
        )
    })
}

/// A response around an already serialised `result` that starts with
/// `gap` spaces ([`ENVELOPE_GAP`] or 0): the head is written over them when
/// it fits (no copy of a large result), else the result is copied behind it.
pub fn encode_response_around(id: &RequestId, mut result: String, gap: usize) -> String {
    let id_json = serde_json::to_string(id).unwrap_or_else(|_| "-1".to_owned());
    let head_len = r#"{"id":,"result":"#.len() + id_json.len();
    let spaces = result
        .as_bytes()
        .get(..gap)
        .is_some_and(|g| g.iter().all(|b| *b == b' '));
    if gap > 0 && head_len <= gap && spaces {
        let head = format!(r#"{{"id":{id_json},"result":"#);
        result.replace_range(..head.len(), &head);
        result.push('}');
        return result;
    }
    let result = result.trim_start();
    let mut s = String::with_capacity(result.len() + id_json.len() + 20);
    s.push_str(r#"{"id":"#);
    s.push_str(&id_json);
    s.push_str(r#","result":"#);
    s.push_str(result);
    s.push('}');
    s
}

/// Serialise an error response.
pub fn encode_error(id: &RequestId, error: &ErrorObject) -> String {
    serde_json::to_string(&ErrorOut { error, id }).unwrap_or_else(|_| {
        format!(
            r#"{{"error":{{"code":{},"message":"unencodable error"}},"id":-1}}"#,
            error.code
        )
    })
}

/// Serialise a notification.
pub fn encode_notification<T: Serialize>(method: &str, params: &T) -> String {
    serde_json::to_string(&NotificationOut { method, params }).unwrap_or_default()
}

#[derive(Serialize)]
struct RequestOut<'a, T: Serialize> {
    id: &'a RequestId,
    method: &'a str,
    params: &'a T,
}

/// Serialise a request, as a client sends it: `{"id":…,"method":…,"params":…}`
/// (no `"jsonrpc"`; `params` always present, `null` for none).
pub fn encode_request<T: Serialize>(
    id: &RequestId,
    method: &str,
    params: &T,
) -> Result<String, serde_json::Error> {
    serde_json::to_string(&RequestOut { id, method, params })
}

#[cfg(test)]
mod tests {
    /// Issue 42 #14: an object that is no message, in 0.169.0's words (as
    /// its binary answers them); 0.130.0's stay "no variant".
    #[test]
    fn an_object_that_is_no_message_is_worded_as_0_169_0_words_it() {
        for (frame, current) in [
            ("{}", "missing field `error`"),
            (r#"{"a":1}"#, "missing field `error`"),
            (r#"{"id":1}"#, "missing field `error`"),
            (r#"{"id":null}"#, super::BAD_REQUEST_ID),
            (r#"{"id":1.5}"#, super::BAD_REQUEST_ID),
            (r#"{"result":1}"#, "missing field `id`"),
        ] {
            let e = super::decode(frame).map(|_| ()).unwrap_err();
            assert_eq!(e.current_text(), current, "{frame}");
            assert_eq!(e.to_string(), super::NO_VARIANT, "{frame}");
        }
    }

    #[test]
    fn a_lone_surrogate_anywhere_is_malformed_with_the_references_text() {
        for (frame, column) in [
            (r#"{"id":"\ud800","method":"x"}"#, 14),
            (
                r#"{"id":1,"method":"process/read","params":{"processId":"\ud800"}}"#,
                62,
            ),
            (
                r#"{"id":1,"method":"process/read","params":{"processId":"x"},"extra":"\ud800"}"#,
                75,
            ),
        ] {
            let e = super::decode(frame).map(|_| ()).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("unexpected end of hex escape at line 1 column {column}"),
                "{frame}"
            );
        }
        // A valid pair and ordinary escapes still decode.
        assert!(super::decode(r#"{"id":1,"method":"x\ud83d\ude00\u0041"}"#).is_ok());
    }

    use super::*;

    fn request(text: &str) -> (RequestId, String, Option<String>) {
        match decode(text).unwrap() {
            Inbound::Request { id, method, params } => {
                (id, method, params.map(|p| p.get().to_owned()))
            }
            other => panic!("not a request: {other:?}"),
        }
    }

    #[test]
    fn ids_are_integers_or_strings() {
        assert_eq!(request(r#"{"id":7,"method":"m"}"#).0, RequestId::Integer(7));
        assert_eq!(
            request(r#"{"id":"a","method":"m","jsonrpc":"2.0"}"#).0,
            RequestId::String("a".into())
        );
        assert_eq!(
            request(r#"{"id":9223372036854775807,"method":"m"}"#).0,
            RequestId::Integer(i64::MAX)
        );
        assert_eq!(
            request(r#"{"id":-5,"method":"m"}"#).0,
            RequestId::Integer(-5)
        );
    }

    #[test]
    fn null_or_fractional_ids_make_notifications() {
        for text in [r#"{"id":null,"method":"m"}"#, r#"{"id":1.5,"method":"m"}"#] {
            assert!(matches!(
                decode(text).unwrap(),
                Inbound::Notification { bad_id: true, .. }
            ));
        }
        assert!(matches!(
            decode(r#"{"method":"m"}"#).unwrap(),
            Inbound::Notification { bad_id: false, .. }
        ));
    }

    #[test]
    fn batches_and_garbage_are_malformed() {
        let e = decode(r#"[{"id":1,"method":"m"}]"#).unwrap_err();
        assert_eq!(e, MalformedMessage::NotAnObject);
        assert_eq!(e.to_string(), NO_VARIANT);
        assert_eq!(e.current_text(), "expected a JSON-RPC object");
        assert!(decode("{not json").is_err());
        assert!(decode(r#"{"foo":1}"#).is_err());
        assert!(matches!(
            decode(r#"{"id":1,"result":{}}"#).unwrap(),
            Inbound::ClientResponse { id: Some(1), .. }
        ));
    }

    #[test]
    fn params_decode_like_the_reference() {
        #[derive(Deserialize, Debug, PartialEq)]
        #[serde(rename_all = "camelCase")]
        struct P {
            process_id: String,
        }
        let raw: Box<RawValue> = serde_json::from_str(r#"["a"]"#).unwrap();
        let p: P = decode_params(Some(&raw)).unwrap();
        assert_eq!(p.process_id, "a");
        let raw: Box<RawValue> = serde_json::from_str(r#"{"x":1}"#).unwrap();
        let e = decode_params::<P>(Some(&raw)).unwrap_err();
        assert_eq!(e, "missing field `processId`");
        let e = decode_params::<P>(None).unwrap_err();
        assert_eq!(e, "invalid type: null, expected struct P");
        let unit: () =
            decode_params(Some(&serde_json::from_str::<Box<RawValue>>("{}").unwrap())).unwrap();
        assert_eq!(unit, ());
    }

    #[test]
    fn output_has_no_jsonrpc_field() {
        let s = encode_response(&RequestId::Integer(1), &serde_json::json!({}));
        assert_eq!(s, r#"{"id":1,"result":{}}"#);
        let s = encode_error(
            &RequestId::UNKNOWN,
            &ErrorObject {
                code: -32600,
                message: "x".into(),
                data: None,
            },
        );
        assert_eq!(s, r#"{"error":{"code":-32600,"message":"x"},"id":-1}"#);
    }

    #[test]
    fn a_response_around_an_encoded_result_matches_serde() {
        #[derive(Serialize)]
        struct R {
            #[serde(rename = "dataBase64")]
            data: &'static str,
        }
        let reply = R { data: "aGkK" };
        let result = serde_json::to_string(&reply).unwrap();
        for id in [RequestId::Integer(7), RequestId::String("a\"b".into())] {
            assert_eq!(
                encode_response_around(&id, result.clone(), 0),
                encode_response(&id, &reply)
            );
        }
    }

    #[test]
    fn a_response_is_built_in_place_when_its_head_fits_the_gap() {
        let gap = ENVELOPE_GAP;
        let result = format!("{}{}", " ".repeat(gap), r#"{"dataBase64":"aGkK"}"#);
        let long = "x".repeat(gap);
        for id in [
            RequestId::Integer(i64::MAX),
            RequestId::String("a\"b".into()),
            RequestId::String(long),
        ] {
            let mut spare = result.clone();
            spare.reserve(1);
            let ptr = spare.as_ptr();
            let fits = serde_json::to_string(&id).unwrap().len() + 16 <= gap;
            let text = encode_response_around(&id, spare, gap);
            assert!(text.starts_with(r#"{"id":"#), "{text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["id"], serde_json::to_value(&id).unwrap());
            assert_eq!(v["result"]["dataBase64"], "aGkK");
            // In place (the same allocation) exactly when the head fits.
            assert_eq!(text.as_ptr() == ptr, fits, "{text}");
        }
        // No gap, or a result shorter than the gap: copied, never a panic.
        assert_eq!(
            encode_response_around(&RequestId::Integer(1), "{}".to_owned(), gap),
            r#"{"id":1,"result":{}}"#
        );
        assert_eq!(
            encode_response_around(&RequestId::Integer(1), "{}".to_owned(), 0),
            r#"{"id":1,"result":{}}"#
        );
    }

    #[test]
    fn requests_carry_id_method_and_params_in_that_order() {
        let s = encode_request(&RequestId::Integer(3), "process/list", &()).unwrap();
        assert_eq!(s, r#"{"id":3,"method":"process/list","params":null}"#);
        let s = encode_request(
            &RequestId::String("a".into()),
            "m",
            &serde_json::json!({"k": 1}),
        )
        .unwrap();
        assert_eq!(s, r#"{"id":"a","method":"m","params":{"k":1}}"#);
        // What the server decodes it into.
        let (id, method, params) = request(&s);
        assert_eq!(
            (id, method),
            (RequestId::String("a".into()), "m".to_owned())
        );
        assert_eq!(params.as_deref(), Some(r#"{"k":1}"#));
    }
}
