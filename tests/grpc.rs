//! The gRPC door with a real tonic client: every RPC, cross-protocol attach
//! (JSON-RPC ⇄ gRPC in one session, one seq cursor), streaming of large
//! files, health and auth failures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::grpc::{authed, spec};
use common::{EVENT_TIMEOUT, Gateway, unb64};
use exec_gateway::transport::grpc::pb;
use pb::file_service_client::FileServiceClient;
use pb::process_service_client::ProcessServiceClient;
use pb::session_service_client::SessionServiceClient;
use serde_json::json;
use tokio_stream::StreamExt as _;
use tonic::Request;
use tonic::transport::Channel;

async fn channel(gw: &Gateway) -> Channel {
    common::grpc::channel(&gw.grpc).await
}

/// A fresh gRPC session for `token`'s tenant.
async fn new_session(sessions: &mut SessionServiceClient<Channel>, token: &str) -> String {
    sessions
        .create_session(authed(
            pb::CreateSessionRequest {
                snapshot: String::new(),
                image: String::new(),
                client_name: "t".into(),
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id
}

/// Drain an event stream: (stdout+pty bytes, exit code, seqs).
async fn drain<S, T>(
    mut s: S,
    get: impl Fn(T) -> Option<pb::ProcessEvent>,
) -> (Vec<u8>, Option<i32>, Vec<u64>)
where
    S: tokio_stream::Stream<Item = Result<T, tonic::Status>> + Unpin,
{
    use pb::process_event::Event;
    let (mut out, mut code, mut seqs) = (Vec::new(), None, Vec::new());
    loop {
        let item = tokio::time::timeout(EVENT_TIMEOUT, s.next())
            .await
            .expect("event timeout")
            .expect("stream ended before closed")
            .expect("stream error");
        let ev = get(item).expect("event");
        seqs.push(ev.seq);
        match ev.event.expect("event body") {
            Event::Output(o) => out.extend(o.data),
            Event::Exited(e) => code = Some(e.exit_code),
            Event::Closed(_) => return (out, code, seqs),
        }
    }
}

#[tokio::test]
async fn every_process_rpc_over_grpc() {
    let gw = Gateway::start("");
    let token = gw.token("t1");
    let ch = channel(&gw).await;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let mut procs = ProcessServiceClient::new(ch.clone());
    let sid = new_session(&mut sessions, &token).await;
    assert_eq!(
        sessions
            .resume_session(authed(
                pb::ResumeSessionRequest {
                    session_id: sid.clone()
                },
                &token
            ))
            .await
            .unwrap()
            .into_inner()
            .session_id,
        sid
    );
    // Start + Write + StreamInput + CloseStdin + Attach.
    let mut s = spec("cat", &["cat"]);
    s.pipe_stdin = true;
    procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(s),
            },
            &token,
        ))
        .await
        .unwrap();
    let w = procs
        .write(authed(
            pb::WriteRequest {
                session_id: sid.clone(),
                process_id: "cat".into(),
                data: b"one\n".to_vec().into(),
                write_id: Some("w".into()),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.status, pb::WriteStatus::Accepted as i32);
    let chunks = vec![
        pb::StreamInputRequest {
            session_id: sid.clone(),
            process_id: "cat".into(),
            data: b"two\n".to_vec().into(),
        },
        pb::StreamInputRequest {
            data: b"three\n".to_vec().into(),
            ..Default::default()
        },
    ];
    let n = procs
        .stream_input(authed(tokio_stream::iter(chunks), &token))
        .await
        .unwrap()
        .into_inner()
        .bytes_written;
    assert_eq!(n, 10);
    procs
        .close_stdin(authed(
            pb::CloseStdinRequest {
                session_id: sid.clone(),
                process_id: "cat".into(),
            },
            &token,
        ))
        .await
        .unwrap();
    let stream = procs
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "cat".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, code, seqs) = drain(stream, |m: pb::AttachResponse| m.event).await;
    assert_eq!(out, b"one\ntwo\nthree\n");
    assert_eq!(code, Some(0));
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // Read (unary long-poll) sees the same log.
    let r = procs
        .read(authed(
            pb::ReadRequest {
                session_id: sid.clone(),
                process_id: "cat".into(),
                after_seq: 0,
                max_bytes: 0,
                wait_ms: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(r.closed && r.exited && r.exit_code == Some(0));
    // With chunks returned, next_seq is the last chunk's seq + 1 (reference rule).
    assert_eq!(r.next_seq, r.chunks.last().unwrap().seq + 1);
    let all: Vec<u8> = r.chunks.iter().flat_map(|c| c.data.clone()).collect();
    assert_eq!(all, b"one\ntwo\nthree\n");
    // Signal, Resize, Terminate, List.
    procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(spec(
                    "sig",
                    &[
                        "sh",
                        "-c",
                        "trap 'exit 9' USR2; echo ready; while :; do sleep 0.05; done",
                    ],
                )),
            },
            &token,
        ))
        .await
        .unwrap();
    let mut tty = spec("tty", &["sh", "-c", "sleep 0.3; stty size"]);
    tty.tty = true;
    procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(tty),
            },
            &token,
        ))
        .await
        .unwrap();
    procs
        .resize(authed(
            pb::ResizeRequest {
                session_id: sid.clone(),
                process_id: "tty".into(),
                rows: 33,
                cols: 99,
            },
            &token,
        ))
        .await
        .unwrap();
    let stream = procs
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "tty".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, _, _) = drain(stream, |m: pb::AttachResponse| m.event).await;
    assert!(
        String::from_utf8_lossy(&out).contains("33 99"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let mut sig = procs
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "sig".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(EVENT_TIMEOUT, sig.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.event.unwrap().seq, 1, "ready printed");
    procs
        .signal(authed(
            pb::SignalRequest {
                session_id: sid.clone(),
                process_id: "sig".into(),
                signal: pb::SignalKind::User2 as i32,
            },
            &token,
        ))
        .await
        .unwrap();
    let (_, code, _) = drain(sig, |m: pb::AttachResponse| m.event).await;
    assert_eq!(code, Some(9));
    procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(spec("long", &["sleep", "30"])),
            },
            &token,
        ))
        .await
        .unwrap();
    let t = procs
        .terminate(authed(
            pb::TerminateRequest {
                session_id: sid.clone(),
                process_id: "long".into(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(t.running);
    let list = procs
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = list
        .processes
        .iter()
        .map(|p| p.process_id.as_str())
        .collect();
    assert_eq!(ids, vec!["cat", "long", "sig", "tty"]);
    // Exec without a session: start and stream to the end.
    let stream = procs
        .exec(authed(
            pb::ExecRequest {
                session_id: String::new(),
                spec: Some(spec("e", &["sh", "-c", "echo hello; exit 5"])),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, code, _) = drain(stream, |m: pb::ExecResponse| m.event).await;
    assert_eq!((out.as_slice(), code), (&b"hello\n"[..], Some(5)));
    // Exec delivers every byte, far beyond the 1 MiB retained window: the
    // output waits for the stream instead of scrolling out before it attaches.
    let stream = procs
        .exec(authed(
            pb::ExecRequest {
                session_id: String::new(),
                spec: Some(spec("bulk", &["head", "-c", "16777216", "/dev/zero"])),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, code, _) = drain(stream, |m: pb::ExecResponse| m.event).await;
    assert_eq!((out.len(), code), (16 << 20, Some(0)));
    // Errors map through the one table.
    let e = procs
        .read(authed(
            pb::ReadRequest {
                session_id: sid.clone(),
                process_id: "nope".into(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(spec("cat", &["true"])),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    let e = procs
        .list(authed(
            pb::ListRequest {
                session_id: "not-a-session".into(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn cross_protocol_attach_shares_session_and_seq() {
    let gw = Gateway::start("");
    let token = gw.token("t1");
    // Started over JSON-RPC, attached over gRPC from a cursor.
    let (mut ws, sid) = gw.session().await;
    ws.call(
        "process/start",
        json!({"processId":"x","argv":["sh","-c","echo a; echo b; echo c"],"cwd":"/tmp","env":{},"tty":false}),
    )
    .await;
    let got = ws.collect("x").await;
    assert_eq!(got.stdout, b"a\nb\nc\n");
    let mut procs = ProcessServiceClient::new(channel(&gw).await);
    let stream = procs
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "x".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, code, seqs) = drain(stream, |m: pb::AttachResponse| m.event).await;
    assert_eq!(out, b"a\nb\nc\n");
    assert_eq!(code, Some(0));
    assert_eq!(seqs, got.seqs, "the same seq numbers on both doors");
    // Started over gRPC, read over JSON-RPC with the same cursor rules.
    procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(spec("y", &["echo", "from-grpc"])),
            },
            &token,
        ))
        .await
        .unwrap();
    let got = ws.collect("y").await;
    assert_eq!(got.stdout, b"from-grpc\n");
    // Another tenant cannot use the session id.
    let e = procs
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &gw.token("t2"),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn files_stream_in_and_out_beyond_one_message() {
    let gw = Gateway::start("");
    let token = gw.token("t1");
    let mut files = FileServiceClient::new(channel(&gw).await);
    let dir = common::scratch();
    let path = dir.path().join("big.bin").display().to_string();
    let data: Vec<u8> = (0..40 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let msgs: Vec<pb::WriteFileRequest> = data
        .chunks(3 * 1024 * 1024)
        .enumerate()
        .map(|(i, c)| pb::WriteFileRequest {
            path: if i == 0 { path.clone() } else { String::new() },
            data: c.to_vec().into(),
            ..Default::default()
        })
        .collect();
    let w = files
        .write_file(authed(tokio_stream::iter(msgs), &token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.bytes_written, data.len() as u64);
    let mut stream = files
        .read_file(authed(
            pb::ReadFileRequest {
                path: path.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut back = Vec::new();
    let mut messages = 0;
    while let Some(m) = tokio::time::timeout(EVENT_TIMEOUT, stream.next())
        .await
        .unwrap()
    {
        back.extend(m.unwrap().data);
        messages += 1;
    }
    assert_eq!(back.len(), data.len());
    assert!(back == data);
    assert!(messages > 16, "streamed in chunks ({messages})");
    // The unary file RPCs.
    let sub = dir.path().join("a/b").display().to_string();
    files
        .create_directory(authed(
            pb::CreateDirectoryRequest {
                path: sub.clone(),
                recursive: true,
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap();
    let m = files
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: sub.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(m.is_directory && !m.is_file);
    files
        .copy(authed(
            pb::CopyRequest {
                source_path: path.clone(),
                destination_path: format!("{sub}/copy.bin"),
                recursive: false,
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap();
    let d = files
        .read_directory(authed(
            pb::ReadDirectoryRequest {
                path: sub.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.entries.len(), 1);
    assert_eq!(d.entries[0].file_name, "copy.bin");
    files
        .remove(authed(
            pb::RemoveRequest {
                path: dir.path().join("a").display().to_string(),
                recursive: true,
                force: false,
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap();
    let e = files
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: sub,
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    // JSON-RPC reads what gRPC wrote.
    let (mut ws, _) = gw.session().await;
    let r = ws.call("fs/getMetadata", json!({"path": path})).await;
    assert_eq!(r["isFile"], true);
    let _ = unb64("");
}

/// 0.169's additions on gRPC: ranged reads, sizes, canonical paths, walks
/// and the environment description.
#[tokio::test]
async fn current_revision_file_and_environment_rpcs() {
    use pb::environment_service_client::EnvironmentServiceClient;
    let dir = common::scratch();
    let root = dir.path().canonicalize().unwrap();
    let gw = Gateway::start_with(|dir| {
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [tenants.t1]\nroot = \"{}\"\n",
            dir.display(),
            root.display()
        )
    });
    let token = gw.token("t1");
    let ch = channel(&gw).await;
    let mut files = FileServiceClient::new(ch.clone());
    std::fs::create_dir_all(root.join("d/e")).unwrap();
    std::fs::write(root.join("d/f.txt"), b"0123456789").unwrap();
    std::os::unix::fs::symlink("d", root.join("link")).unwrap();
    let p = |rel: &str| root.join(rel).display().to_string();

    let mut s = files
        .read_file(authed(
            pb::ReadFileRequest {
                path: p("d/f.txt"),
                offset: 3,
                length: 4,
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.next().await {
        got.extend(m.unwrap().data);
    }
    assert_eq!(got, b"3456");
    let m = files
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: p("d/f.txt"),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.size, 10);
    let c = files
        .canonicalize(authed(
            pb::CanonicalizeRequest {
                path: p("link/e/../f.txt"),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.path, p("d/f.txt"));
    let w = files
        .walk(authed(
            pb::WalkRequest {
                path: p("d"),
                max_depth: 8,
                max_directories: 8,
                max_entries: 8,
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut entries: Vec<_> = w.entries.iter().map(|e| (e.path.clone(), e.kind)).collect();
    entries.sort();
    assert_eq!(
        entries,
        vec![
            (p("d/e"), pb::WalkEntryKind::Directory as i32),
            (p("d/f.txt"), pb::WalkEntryKind::File as i32),
        ]
    );
    assert!(!w.truncated);
    // Zero limits are refused; paths outside the root look missing.
    let e = files
        .walk(authed(
            pb::WalkRequest {
                path: p("d"),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = files
        .canonicalize(authed(
            pb::CanonicalizeRequest {
                path: "/etc/passwd".to_owned(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().contains("outside the tenant root"), "{e:?}");

    let info = EnvironmentServiceClient::new(ch.clone())
        .get_info(authed(
            pb::GetInfoRequest {
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.cwd, root.display().to_string());
    assert_eq!(info.platform_os, "linux");
    assert_eq!(info.executor_version, env!("CARGO_PKG_VERSION"));
    assert!(info.shell_path.starts_with('/'), "{info:?}");
    assert_eq!(info.capabilities.get("fsWatchMissing"), Some(&true));
    assert_eq!(info.capabilities.get("networkProxyLaunch"), Some(&false));
    // Unauthenticated: refused before the service.
    let e = EnvironmentServiceClient::new(ch)
        .get_info(pb::GetInfoRequest {
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
}

#[tokio::test]
async fn auth_failures_and_scopes_over_grpc() {
    let gw = Gateway::start("");
    let ch = channel(&gw).await;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let e = sessions
        .create_session(Request::new(pb::CreateSessionRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let forged = common::mint(&common::random_secret(), "t1", common::ALL_SCOPES);
    let e = sessions
        .create_session(authed(pb::CreateSessionRequest::default(), &forged))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let no_scope = common::mint(&gw.secret, "t1", "admin");
    let e = sessions
        .create_session(authed(pb::CreateSessionRequest::default(), &no_scope))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    // A read-only token may read files but not start processes.
    let ro = common::mint(&gw.secret, "t1", "fs:read");
    let sid = sessions
        .create_session(authed(pb::CreateSessionRequest::default(), &ro))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let e = ProcessServiceClient::new(ch.clone())
        .start(authed(
            pb::StartRequest {
                session_id: sid,
                spec: Some(spec("p", &["true"])),
            },
            &ro,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let m = FileServiceClient::new(ch.clone())
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: "/tmp".into(),
                ..Default::default()
            },
            &ro,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(m.is_directory);
    // Health answers SERVING.
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    let h = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "exec_gateway.v1.ProcessService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        h.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn reflection_lists_services_and_health_flips_when_draining() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut gw = Gateway::start("[server]\nshutdown_grace = \"3s\"\n");
    let ch = channel(&gw).await;
    // grpcurl's first question: which services are there?
    let mut refl = ServerReflectionClient::new(ch.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let msg = resp.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "exec_gateway.v1.ProcessService",
        "exec_gateway.v1.FileService",
        "exec_gateway.v1.SessionService",
        "exec_gateway.v1.EnvironmentService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    // Keep a process running so draining lasts the grace period.
    let token = gw.token("t1");
    let mut procs = ProcessServiceClient::new(ch.clone());
    let _stream = procs
        .exec(authed(
            pb::ExecRequest {
                session_id: String::new(),
                spec: Some(spec("hold", &["sleep", "30"])),
            },
            &token,
        ))
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    gw.signal(15);
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        let h = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        if h.status == tonic_health::pb::health_check_response::ServingStatus::NotServing as i32 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never turned NOT_SERVING"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gw.wait_exit().success());
}

#[tokio::test]
async fn close_session_ends_only_the_callers_own_session() {
    let gw = Gateway::start("");
    let (t1, t2) = (gw.token("t1"), gw.token("t2"));
    let ch = channel(&gw).await;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let mut procs = ProcessServiceClient::new(ch.clone());
    let sid = new_session(&mut sessions, &t1).await;
    procs
        .start(authed(
            pb::StartRequest {
                session_id: sid.clone(),
                spec: Some(spec("s", &["sleep", "300"])),
            },
            &t1,
        ))
        .await
        .unwrap();
    // Another tenant naming it: not found, and nothing happens to it.
    let close = |token: &str| {
        authed(
            pb::CloseSessionRequest {
                session_id: sid.clone(),
            },
            token,
        )
    };
    let e = sessions.close_session(close(&t2)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // Its own tenant's token without the exec scope may not end its
    // processes either.
    let reader = common::mint(&gw.secret, "t1", "fs:read");
    let e = sessions.close_session(close(&reader)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let listed = procs
        .list(authed(
            pb::ListRequest {
                session_id: sid.clone(),
            },
            &t1,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.processes.len(), 1);
    // Its owner: gone at once, its process killed.
    sessions.close_session(close(&t1)).await.unwrap();
    let e = sessions
        .resume_session(authed(
            pb::ResumeSessionRequest {
                session_id: sid.clone(),
            },
            &t1,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = sessions.close_session(close(&t1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}
