//! The `process/*` calls: each builds the protocol's params and reads the
//! protocol's result.

use super::super::error::Result;
use super::super::types::{
    ProcessInfo, ProcessSpec, Signal, WriteStatus, process_info, write_status,
};
use super::WsClient;
use super::attach::WsAttachment;
use crate::protocol::ByteChunk;
use crate::protocol::methods;
use crate::protocol::process::{
    ListResponse, ProcessIdParams, ResizeParams, SignalParams, TerminateResponse, WriteParams,
    WriteResponse,
};

impl WsClient {
    pub(in super::super) async fn start(&self, spec: &ProcessSpec) -> Result<()> {
        let params = spec.exec_params(self.wire_path(&spec.cwd)?);
        self.call_unit(methods::PROCESS_START, &params).await
    }

    /// Start a process with its attachment already listening: every
    /// notification is caught from seq 1, with no read to catch up.
    pub(in super::super) async fn exec(&self, spec: &ProcessSpec) -> Result<WsAttachment<'_>> {
        let a = WsAttachment::new(self, &spec.process_id, 0).listening_from_seq_one();
        self.start(spec).await?;
        Ok(a)
    }

    pub(in super::super) fn attach(
        &self,
        process_id: &str,
        after_seq: u64,
    ) -> Result<WsAttachment<'_>> {
        Ok(WsAttachment::new(self, process_id, after_seq))
    }

    pub(in super::super) async fn write(
        &self,
        process_id: &str,
        data: &[u8],
    ) -> Result<WriteStatus> {
        let params = WriteParams {
            process_id: process_id.to_owned(),
            chunk: ByteChunk(data.to_vec()),
            write_id: Some(self.ids.next("w")),
        };
        let r: WriteResponse = self.call(methods::PROCESS_WRITE, &params).await?;
        Ok(write_status(r.status))
    }

    pub(in super::super) async fn close_stdin(&self, process_id: &str) -> Result<()> {
        self.call_unit(methods::PROCESS_CLOSE_STDIN, &process_params(process_id))
            .await
    }

    pub(in super::super) async fn signal(&self, process_id: &str, signal: Signal) -> Result<()> {
        let params = SignalParams {
            process_id: process_id.to_owned(),
            signal: signal.wire(),
        };
        self.call_unit(methods::PROCESS_SIGNAL, &params).await
    }

    pub(in super::super) async fn resize(
        &self,
        process_id: &str,
        rows: u16,
        cols: u16,
    ) -> Result<()> {
        let params = ResizeParams {
            process_id: process_id.to_owned(),
            rows,
            cols,
        };
        self.call_unit(methods::PROCESS_RESIZE, &params).await
    }

    pub(in super::super) async fn terminate(&self, process_id: &str) -> Result<bool> {
        let r: TerminateResponse = self
            .call(methods::PROCESS_TERMINATE, &process_params(process_id))
            .await?;
        Ok(r.running)
    }

    pub(in super::super) async fn list(&self) -> Result<Vec<ProcessInfo>> {
        let r: ListResponse = self.call(methods::PROCESS_LIST, &()).await?;
        Ok(r.processes.into_iter().map(process_info).collect())
    }
}

fn process_params(process_id: &str) -> ProcessIdParams {
    ProcessIdParams {
        process_id: process_id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::{Value, json};

    use super::super::super::error::ClientError;
    use super::super::testing::{error, fake};
    use super::*;
    use crate::protocol::revision::Revision;

    fn spec() -> ProcessSpec {
        let mut spec = ProcessSpec::new("p1", ["cat"]);
        spec.cwd = "/tmp/a b".into();
        spec.pipe_stdin = true;
        spec
    }

    #[tokio::test]
    async fn start_sends_the_protocols_exec_params() {
        let f = fake(Revision::Nov2026, |_, p| {
            Ok(json!({"processId": p["processId"]}))
        });
        f.client.start(&spec()).await.unwrap();
        assert_eq!(f.methods(), ["process/start"]);
        assert_eq!(
            f.params(0),
            json!({"processId": "p1", "argv": ["cat"], "cwd": "file:///tmp/a%20b", "env": {},
                   "tty": false, "pipeStdin": true, "arg0": null,
                   "envPolicy": {"inherit": "all", "ignoreDefaultExcludes": false,
                                 "exclude": [], "set": {}, "includeOnly": []},
                   "sandbox": null})
        );
        let frame = &f.seen.lock()[0].2;
        assert!(
            frame.starts_with(r#"{"id":1,"method":"process/start","params":{"processId":"p1","#),
            "{frame}"
        );
        assert!(!frame.contains("jsonrpc"));
    }

    #[tokio::test]
    async fn a_may_session_gets_plain_paths() {
        let f = fake(Revision::May2026, |_, _| Ok(json!({"processId": "p1"})));
        f.client.start(&spec()).await.unwrap();
        assert_eq!(f.params(0)["cwd"], "/tmp/a b");
        let mut relative = spec();
        relative.cwd = "tmp".into();
        assert!(matches!(
            f.client.start(&relative).await,
            Err(ClientError::Usage(_))
        ));
        assert_eq!(f.methods().len(), 1, "nothing sent for a relative cwd");
    }

    #[tokio::test]
    async fn writes_carry_base64_and_a_fresh_write_id() {
        let f = fake(Revision::Nov2026, |_, p| {
            Ok(match p["processId"].as_str() {
                Some("gone") => json!({"status": "unknownProcess"}),
                _ => json!({"status": "stdinClosed"}),
            })
        });
        assert_eq!(
            f.client.write("p1", b"hi\n").await.unwrap(),
            WriteStatus::StdinClosed
        );
        assert_eq!(
            f.client.write("gone", b"").await.unwrap(),
            WriteStatus::UnknownProcess
        );
        let (a, b) = (f.params(0), f.params(1));
        assert_eq!(a["chunk"], "aGkK");
        assert_eq!(b["chunk"], "");
        let ids = [
            a["writeId"].as_str().unwrap(),
            b["writeId"].as_str().unwrap(),
        ];
        assert!(ids[0].starts_with("w-") && ids[0] != ids[1], "{ids:?}");
    }

    #[tokio::test]
    async fn an_unknown_write_status_is_a_protocol_error() {
        let f = fake(Revision::Nov2026, |_, _| Ok(json!({"status": "maybe"})));
        assert!(matches!(
            f.client.write("p1", b"x").await,
            Err(ClientError::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn signal_resize_close_stdin_terminate_and_list() {
        let f = fake(Revision::Nov2026, |m, _| {
            Ok(match m {
                "process/terminate" => json!({"running": true}),
                "process/list" => json!({"processes": [
                    {"processId": "p1", "state": "running", "tty": false, "exitCode": null,
                     "nextSeq": 3, "firstRetainedSeq": 1}]}),
                _ => json!({}),
            })
        });
        let c = &f.client;
        c.signal("p1", Signal::User2).await.unwrap();
        c.resize("p1", 40, 120).await.unwrap();
        c.close_stdin("p1").await.unwrap();
        assert!(c.terminate("p1").await.unwrap());
        let list = c.list().await.unwrap();
        assert_eq!(
            f.methods(),
            [
                "process/signal",
                "process/resize",
                "process/closeStdin",
                "process/terminate",
                "process/list"
            ]
        );
        assert_eq!(f.params(0), json!({"processId": "p1", "signal": "user2"}));
        assert_eq!(
            f.params(1),
            json!({"processId": "p1", "rows": 40, "cols": 120})
        );
        assert_eq!(f.params(2), json!({"processId": "p1"}));
        assert_eq!(f.params(3), json!({"processId": "p1"}));
        assert_eq!(f.params(4), Value::Null);
        assert_eq!(
            list,
            [ProcessInfo {
                process_id: "p1".into(),
                state: "running".into(),
                tty: false,
                exit_code: None,
                next_seq: 3
            }]
        );
    }

    #[tokio::test]
    async fn gateway_errors_come_back_as_rpc_errors() {
        let f = fake(Revision::Nov2026, |_, _| {
            Err(error(-32600, "unknown process id p9"))
        });
        let e = f.client.terminate("p9").await.unwrap_err();
        assert!(e.is_not_found(), "{e:?}");
        assert!(
            matches!(&e, ClientError::Rpc { code: -32600, message, .. } if message == "unknown process id p9")
        );
    }

    #[tokio::test]
    async fn an_overloaded_gateway_is_asked_again() {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let f = fake(Revision::Nov2026, move |_, _| {
            if calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                let mut e = error(-32001, "busy");
                e.data = Some(json!({"retryAfterMs": 10}));
                Err(e)
            } else {
                Ok(json!({"running": false}))
            }
        });
        assert!(!f.client.terminate("p1").await.unwrap());
        let frames: Vec<String> = f.seen.lock().iter().map(|s| s.2.clone()).collect();
        assert_eq!(frames.len(), 2);
        assert!(frames[0].starts_with(r#"{"id":1,"#) && frames[1].starts_with(r#"{"id":2,"#));
    }
}
