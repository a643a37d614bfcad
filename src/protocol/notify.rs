//! Server → client notifications of the exec API, encoded on the hot path.
//!
//! Output notifications are the bulk of what the gateway writes, so they are
//! written straight into one string: the process id is JSON-escaped once per
//! process ([`json_string`]) and the chunk is base64-encoded into place. The
//! tests pin every encoder to the serde types of [`super::process`] and
//! [`super::v0`], so the two cannot drift apart.

use std::fmt::Write as _;

use super::methods;
use super::process::StreamName;

/// `s` as a JSON string literal (quotes included).
pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// `process/output`.
pub fn process_output(id_json: &str, seq: u64, stream: StreamName, data: &[u8]) -> String {
    let mut s = String::with_capacity(96 + id_json.len() + data.len().div_ceil(3) * 4);
    let _ = write!(
        s,
        r#"{{"method":"{}","params":{{"processId":{id_json},"seq":{seq},"stream":"{}","chunk":""#,
        methods::PROCESS_OUTPUT,
        stream.as_str()
    );
    super::base64_into(data, &mut s);
    s.push_str("\"}}");
    s
}

/// `process/exited`; 0.169.0 adds `sandboxDenied`.
pub fn process_exited(
    id_json: &str,
    seq: u64,
    exit_code: i32,
    sandbox_denied: Option<bool>,
) -> String {
    match sandbox_denied {
        None => format!(
            r#"{{"method":"{}","params":{{"processId":{id_json},"seq":{seq},"exitCode":{exit_code}}}}}"#,
            methods::PROCESS_EXITED
        ),
        Some(d) => format!(
            r#"{{"method":"{}","params":{{"processId":{id_json},"seq":{seq},"exitCode":{exit_code},"sandboxDenied":{d}}}}}"#,
            methods::PROCESS_EXITED
        ),
    }
}

/// `fs/missingChanged` (0.169.0).
pub fn fs_missing_changed(watch_id: u64) -> String {
    format!(
        r#"{{"method":"{}","params":{{"watchId":{watch_id}}}}}"#,
        methods::FS_MISSING_CHANGED
    )
}

/// `process/closed`.
pub fn process_closed(id_json: &str, seq: u64) -> String {
    format!(
        r#"{{"method":"{}","params":{{"processId":{id_json},"seq":{seq}}}}}"#,
        methods::PROCESS_CLOSED
    )
}

/// v0 `command/exec/outputDelta`: no seq, and PTY output is `stdout`.
pub fn command_exec_output_delta(id_json: &str, stream: StreamName, data: &[u8]) -> String {
    let stream = match stream {
        StreamName::Stderr => "stderr",
        StreamName::Stdout | StreamName::Pty => "stdout",
    };
    let mut s = String::with_capacity(96 + id_json.len() + data.len().div_ceil(3) * 4);
    let _ = write!(
        s,
        r#"{{"method":"{}","params":{{"processId":{id_json},"stream":"{stream}","chunk":""#,
        methods::COMMAND_EXEC_OUTPUT_DELTA
    );
    super::base64_into(data, &mut s);
    s.push_str("\"}}");
    s
}

/// v0 `command/exec/exited` (sent once all output has been sent).
pub fn command_exec_exited(id_json: &str, exit_code: i32) -> String {
    format!(
        r#"{{"method":"{}","params":{{"processId":{id_json},"exitCode":{exit_code}}}}}"#,
        methods::COMMAND_EXEC_EXITED
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::Value;

    use super::*;
    use crate::protocol::ByteChunk;
    use crate::protocol::jsonrpc::encode_notification;
    use crate::protocol::process::{ClosedNotification, ExitedNotification, OutputNotification};
    use crate::protocol::v0;

    fn same(fast: &str, slow: &str) {
        let (a, b): (Value, Value) = (
            serde_json::from_str(fast).unwrap(),
            serde_json::from_str(slow).unwrap(),
        );
        assert_eq!(a, b, "fast: {fast}\nserde: {slow}");
    }

    const IDS: [&str; 3] = ["p1", "a \"quoted\"\n\\id", "ünï"];

    #[test]
    fn process_notifications_match_their_types() {
        for id in IDS {
            let j = json_string(id);
            for (stream, data) in [
                (StreamName::Stdout, &b"hi\n"[..]),
                (StreamName::Stderr, &b""[..]),
                (StreamName::Pty, &[0u8, 255, 10][..]),
            ] {
                let typed = OutputNotification {
                    process_id: id.to_owned(),
                    seq: 7,
                    stream,
                    chunk: ByteChunk(data.to_vec()),
                };
                same(
                    &process_output(&j, 7, stream, data),
                    &encode_notification(methods::PROCESS_OUTPUT, &typed),
                );
            }
            for denied in [None, Some(false)] {
                let typed = ExitedNotification {
                    process_id: id.to_owned(),
                    seq: 3,
                    exit_code: -1,
                    sandbox_denied: denied,
                };
                same(
                    &process_exited(&j, 3, -1, denied),
                    &encode_notification(methods::PROCESS_EXITED, &typed),
                );
            }
            let typed = ClosedNotification {
                process_id: id.to_owned(),
                seq: 4,
            };
            same(
                &process_closed(&j, 4),
                &encode_notification(methods::PROCESS_CLOSED, &typed),
            );
        }
    }

    #[test]
    fn missing_changed_matches_its_type() {
        let typed = crate::protocol::fs::MissingChangedNotification { watch_id: 11 };
        same(
            &fs_missing_changed(11),
            &encode_notification(methods::FS_MISSING_CHANGED, &typed),
        );
    }

    #[test]
    fn v0_notifications_match_their_types() {
        for id in IDS {
            let j = json_string(id);
            let typed = v0::OutputDeltaNotification {
                process_id: id.to_owned(),
                stream: "stdout".to_owned(),
                chunk: ByteChunk(b"x".to_vec()),
            };
            same(
                &command_exec_output_delta(&j, StreamName::Pty, b"x"),
                &encode_notification(methods::COMMAND_EXEC_OUTPUT_DELTA, &typed),
            );
            let typed = v0::ExitedNotification {
                process_id: id.to_owned(),
                exit_code: 2,
            };
            same(
                &command_exec_exited(&j, 2),
                &encode_notification(methods::COMMAND_EXEC_EXITED, &typed),
            );
        }
    }
}
