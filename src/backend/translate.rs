//! What the gateway translates when a gRPC client's session runs on a
//! remote executor: the executor speaks JSON-RPC in its own revision, the
//! gRPC door wants typed replies (docs/executors.md, "gRPC").
//!
//! - Paths: gRPC carries plain absolute paths; a 0.169.0 executor takes
//!   `file://` URIs only. Params are rewritten before the call, and the
//!   executor's `writeId`, required by 0.169.0, is supplied.
//! - Replies: the executor's JSON result becomes the typed reply of the
//!   call (only the calls the gRPC door makes on a session), its `file://`
//!   URIs plain paths again.

use serde_json::Value;

use crate::error::GatewayError;
use crate::protocol::Empty;
use crate::protocol::environment::EnvironmentInfo;
use crate::rpc::{Call, Reply};

/// Param fields that hold a path.
const PATH_FIELDS: [&str; 4] = ["path", "cwd", "sourcePath", "destinationPath"];

/// `params` for an executor that takes `file://` URIs (`uris`): plain
/// absolute paths become URIs, and `process/write` gets a `writeId`.
pub fn params_for_executor(call: &Call, uris: bool) -> Result<String, GatewayError> {
    let json = call.params_json()?;
    if !uris {
        return Ok(json);
    }
    let mut v: Value = serde_json::from_str(&json)
        .map_err(|e| GatewayError::Internal(format!("encoding params: {e}")))?;
    if let Value::Object(map) = &mut v {
        for key in PATH_FIELDS {
            if let Some(Value::String(p)) = map.get(key)
                && p.starts_with('/')
                && let Ok(u) = url::Url::from_file_path(p)
            {
                map.insert(key.to_owned(), Value::String(u.to_string()));
            }
        }
        if matches!(call, Call::ProcessWrite(_)) && map.get("writeId").is_none_or(Value::is_null) {
            map.insert(
                "writeId".to_owned(),
                Value::String(uuid::Uuid::new_v4().to_string()),
            );
        }
    }
    Ok(v.to_string())
}

/// The typed reply of `call` from the executor's JSON `result`.
pub fn reply_of(call: &Call, result: &str) -> Result<Reply, GatewayError> {
    let bad = |e: serde_json::Error| {
        GatewayError::Internal(format!("the executor's answer is not understood: {e}"))
    };
    Ok(match call {
        Call::ProcessStart(_) => Reply::ProcessStart(serde_json::from_str(result).map_err(bad)?),
        Call::ProcessRead(_) => Reply::ProcessRead(serde_json::from_str(result).map_err(bad)?),
        Call::ProcessWrite(_) => Reply::ProcessWrite(serde_json::from_str(result).map_err(bad)?),
        Call::ProcessTerminate(_) => {
            Reply::ProcessTerminate(serde_json::from_str(result).map_err(bad)?)
        }
        Call::ProcessList(_) => Reply::ProcessList(serde_json::from_str(result).map_err(bad)?),
        Call::FsReadFile(_) => Reply::FsReadFile(serde_json::from_str(result).map_err(bad)?),
        Call::FsGetMetadata(_) => Reply::FsGetMetadata(serde_json::from_str(result).map_err(bad)?),
        Call::FsReadDirectory(_) => {
            Reply::FsReadDirectory(serde_json::from_str(result).map_err(bad)?)
        }
        Call::FsCanonicalize(_) => {
            let mut r: crate::protocol::fs::CanonicalizeResponse =
                serde_json::from_str(result).map_err(bad)?;
            plain(&mut r.path);
            Reply::FsCanonicalize(r)
        }
        Call::FsWalk(_) => {
            let mut r: crate::protocol::fs::WalkResponse =
                serde_json::from_str(result).map_err(bad)?;
            r.entries.iter_mut().for_each(|e| plain(&mut e.path));
            r.errors.iter_mut().for_each(|e| plain(&mut e.path));
            Reply::FsWalk(r)
        }
        Call::FsOpen(_) => Reply::FsOpen(serde_json::from_str(result).map_err(bad)?),
        Call::FsReadBlock(_) => Reply::FsReadBlock(serde_json::from_str(result).map_err(bad)?),
        Call::ProcessSignal(_)
        | Call::ProcessResize(_)
        | Call::ProcessCloseStdin(_)
        | Call::FsWriteFile(_)
        | Call::FsCreateDirectory(_)
        | Call::FsRemove(_)
        | Call::FsCopy(_)
        | Call::FsWriteBlock(_)
        | Call::FsClose(_) => Reply::Empty(Empty {}),
        other => {
            return Err(GatewayError::InvalidRequest(format!(
                "{} is not served to gRPC clients on remote executors",
                other.method()
            )));
        }
    })
}

/// A `file://` URI as the plain path it names, decoded as a client's
/// path is (anything else is left as it was).
fn plain(path: &mut String) {
    let wire = crate::protocol::path::WirePath::parse(std::mem::take(path));
    *path = wire.as_str().to_owned();
}

/// An executor's description with plain paths (for gRPC).
pub fn plain_environment(mut e: EnvironmentInfo) -> EnvironmentInfo {
    plain(&mut e.cwd);
    plain(&mut e.user_home_dir);
    plain(&mut e.temp_dir);
    e.prepend_path_dirs.iter_mut().for_each(plain);
    e.temporary_directories.iter_mut().for_each(plain);
    e
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::protocol::process::WriteParams;

    #[test]
    fn paths_become_uris_and_writes_get_an_id_for_a_current_executor() {
        let call = Call::decode(
            "process/start",
            Some(
                &serde_json::value::RawValue::from_string(
                    r#"{"processId":"p","argv":["true"],"cwd":"/srv/a b","env":{},"tty":false}"#
                        .to_owned(),
                )
                .unwrap(),
            ),
        )
        .unwrap();
        let v: Value = serde_json::from_str(&params_for_executor(&call, true).unwrap()).unwrap();
        assert_eq!(v["cwd"], "file:///srv/a%20b");
        let v: Value = serde_json::from_str(&params_for_executor(&call, false).unwrap()).unwrap();
        assert_eq!(v["cwd"], "/srv/a b");
        let write = Call::ProcessWrite(WriteParams {
            process_id: "p".into(),
            chunk: crate::protocol::ByteChunk(b"x".to_vec()),
            write_id: None,
        });
        let v: Value = serde_json::from_str(&params_for_executor(&write, true).unwrap()).unwrap();
        assert!(v["writeId"].as_str().is_some_and(|w| !w.is_empty()));
    }
}
