//! gRPC for a tenant placed on executors: its sessions, processes and
//! files run on the official Codex 0.169.0 executor (direct transport),
//! the gateway translating between typed gRPC calls and the executor's
//! JSON-RPC (plain paths and `file://` URIs, streams from the executor's
//! notifications, files in blocks).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Gateway;
use common::direct::{Codex, WAIT, codex_169, config, wait_readyz};
use common::grpc::{authed, channel, spec};
use exec_gateway::transport::grpc::pb;
use futures_util::StreamExt as _;
use pb::process_event::Event;

/// A gateway whose tenant `t1` runs on the official 0.169.0 executor, a
/// gRPC channel to it and a session there.
struct On {
    gw: Gateway,
    codex: Codex,
    ch: tonic::transport::Channel,
    token: String,
    sid: String,
}

impl On {
    /// `None` without the binary (the reason printed).
    async fn start(environment: &str) -> Option<On> {
        let bin = codex_169()?;
        let gw = Gateway::start_with(|d| config(d, None, ""));
        let codex = Codex::start(&bin, &gw.addr, environment);
        wait_readyz(&gw, "pool p: 1 executors, 1 idle links").await;
        let ch = channel(&gw.grpc).await;
        let token = gw.token("t1");
        let sid = pb::session_service_client::SessionServiceClient::new(ch.clone())
            .create_session(authed(pb::CreateSessionRequest::default(), &token))
            .await
            .unwrap()
            .into_inner()
            .session_id;
        Some(On {
            gw,
            codex,
            ch,
            token,
            sid,
        })
    }
}

/// Output, exit code and whether `closed` came.
async fn drain<T>(
    mut s: tonic::Streaming<T>,
    event: impl Fn(T) -> Option<pb::ProcessEvent>,
) -> (String, Option<i32>, bool) {
    let (mut out, mut code) = (Vec::new(), None);
    while let Some(item) = tokio::time::timeout(WAIT, s.next()).await.unwrap() {
        match event(item.unwrap()).and_then(|e| e.event) {
            Some(Event::Output(o)) => out.extend(o.data),
            Some(Event::Exited(x)) => code = Some(x.exit_code),
            Some(Event::Closed(_)) => {
                return (String::from_utf8_lossy(&out).into_owned(), code, true);
            }
            None => {}
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), code, false)
}

/// gRPC serves an executor-placed tenant too: its sessions run on the
/// official 0.169.0 executor, the gateway translating (plain paths to
/// `file://` URIs, `writeId`s supplied, streams from its notifications).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_sessions_of_an_executor_placed_tenant_run_on_the_official_0169_executor() {
    let Some(On {
        gw: _gw,
        codex,
        ch,
        token,
        sid,
    }) = On::start("env-g").await
    else {
        return;
    };
    assert!(sid.contains("x-env-g@p."), "{sid}");
    let mut procs = pb::process_service_client::ProcessServiceClient::new(ch);
    let work = codex.work().display().to_string();
    // Exec: started there (in its directory, given as a plain path) and
    // streamed to its end.
    let mut s = spec("e1", &["sh", "-c", "pwd; exit 3"]);
    s.cwd = work.clone();
    let stream = procs
        .exec(authed(
            pb::ExecRequest {
                session_id: sid.clone(),
                spec: Some(s),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, code, closed) = drain(stream, |r: pb::ExecResponse| r.event).await;
    assert_eq!(
        (out.as_str(), code, closed),
        (format!("{work}\n").as_str(), Some(3), true)
    );
    // Start, write to its stdin, attach.
    let mut s = spec("c1", &["sh", "-c", "read line; echo got:$line"]);
    s.cwd = work.clone();
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
    procs
        .write(authed(
            pb::WriteRequest {
                session_id: sid.clone(),
                process_id: "c1".into(),
                data: b"hello\n".to_vec().into(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap();
    let stream = procs
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "c1".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let (out, code, closed) = drain(stream, |r: pb::AttachResponse| r.event).await;
    assert_eq!((out.as_str(), code, closed), ("got:hello\n", Some(0), true));
}

/// Files over gRPC on the session's executor: streamed both ways in blocks
/// (byte-exact, several blocks, offsets), every unary call with paths
/// plain both ways, the environment as the executor described itself; a
/// call that names no session runs on an executor too (in a session of
/// its own); what is missing is NOT_FOUND, a process included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_files_of_an_executor_placed_tenant_are_the_executors() {
    let Some(On {
        gw,
        codex,
        ch,
        token,
        sid,
    }) = On::start("env-f").await
    else {
        return;
    };
    let mut files = pb::file_service_client::FileServiceClient::new(ch.clone());
    let work = codex.work();
    let p = |name: &str| work.join(name).display().to_string();
    // 2.5 MiB + 7 bytes, sent in three messages: more than two blocks.
    let data: Vec<u8> = (0..(5 * 512 * 1024 + 7))
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let parts: Vec<_> = data
        .chunks(1_000_000)
        .enumerate()
        .map(|(i, c)| pb::WriteFileRequest {
            path: if i == 0 { p("d/f.bin") } else { String::new() },
            data: c.to_vec().into(),
            session_id: if i == 0 { sid.clone() } else { String::new() },
        })
        .collect();
    files
        .create_directory(authed(
            pb::CreateDirectoryRequest {
                path: p("d"),
                recursive: true,
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap();
    let wrote = files
        .write_file(authed(futures_util::stream::iter(parts), &token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(wrote.bytes_written, data.len() as u64);
    assert!(
        std::fs::read(work.join("d/f.bin")).unwrap() == data,
        "written whole"
    );
    let read = |offset: u64, length: u64| {
        let mut files = files.clone();
        let (path, sid, token) = (p("d/f.bin"), sid.clone(), token.clone());
        async move {
            let req = pb::ReadFileRequest {
                path,
                offset,
                length,
                session_id: sid,
            };
            let mut s = files
                .read_file(authed(req, &token))
                .await
                .unwrap()
                .into_inner();
            let mut got = Vec::new();
            while let Some(m) = tokio::time::timeout(WAIT, s.next()).await.unwrap() {
                got.extend(m.unwrap().data);
            }
            got
        }
    };
    assert!(read(0, 0).await == data, "read whole");
    assert!(
        read(1_048_570, 20).await == data[1_048_570..1_048_590],
        "a slice across blocks"
    );
    assert!(
        read(data.len() as u64 - 3, 0).await == data[data.len() - 3..],
        "the tail"
    );
    let meta = files
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: p("d/f.bin"),
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(meta.is_file && !meta.is_directory, "{meta:?}");
    files
        .copy(authed(
            pb::CopyRequest {
                source_path: p("d/f.bin"),
                destination_path: p("d/g.bin"),
                recursive: false,
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap();
    std::os::unix::fs::symlink(work.join("d/g.bin"), work.join("link")).unwrap();
    let canon = files
        .canonicalize(authed(
            pb::CanonicalizeRequest {
                path: p("link"),
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(canon.path, p("d/g.bin"), "a plain path back");
    let walk = files
        .walk(authed(
            pb::WalkRequest {
                path: p("d"),
                max_depth: 4,
                max_directories: 10,
                max_entries: 10,
                session_id: sid.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut walked: Vec<_> = walk.entries.iter().map(|e| e.path.clone()).collect();
    walked.sort();
    assert_eq!(walked, vec![p("d/f.bin"), p("d/g.bin")]);
    files
        .remove(authed(
            pb::RemoveRequest {
                path: p("d/f.bin"),
                recursive: false,
                force: false,
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap();
    let listed = files
        .read_directory(authed(
            pb::ReadDirectoryRequest {
                path: p("d"),
                session_id: sid.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = listed
        .entries
        .iter()
        .map(|e| e.file_name.as_str())
        .collect();
    assert_eq!(names, vec!["g.bin"]);
    let missing = files
        .read_file(authed(
            pb::ReadFileRequest {
                path: p("d/f.bin"),
                session_id: sid.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    // A process the executor does not have: NOT_FOUND, not a slow reader.
    let mut procs = pb::process_service_client::ProcessServiceClient::new(ch.clone());
    let mut s = procs
        .attach(authed(
            pb::AttachRequest {
                session_id: sid.clone(),
                process_id: "nobody".into(),
                after_seq: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let end = tokio::time::timeout(WAIT, s.next()).await.unwrap();
    let status = end.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    // (Last: the named session may expire, its 2 s TTL passing while
    // the executor dials a link for each single call's session.)
    // The environment is the executor's; a call naming no session gets a
    // session of its own on the executor (its working directory is the
    // executor's, not the tenant root `/`).
    let mut env = pb::environment_service_client::EnvironmentServiceClient::new(ch);
    for session_id in [sid.clone(), String::new()] {
        let info = env
            .get_info(authed(pb::GetInfoRequest { session_id }, &token))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.cwd, work.display().to_string());
    }
    let sessionless = files
        .get_metadata(authed(
            pb::GetMetadataRequest {
                path: p("d/g.bin"),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(sessionless.is_file);
    // Sessions opened for single calls are gone: the executor's links are
    // idle again but for the named session's.
    wait_readyz(&gw, "1 idle links").await;
}

/// An interactive process over gRPC on the executor: each line written to
/// its stdin comes back while its output stream is open. The executor
/// answers one request at a time per connection, so a stream that held a
/// long poll there would hold each write behind it; the stream follows
/// the executor's notifications instead (the round trips are printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_process_on_the_executor_answers_each_write() {
    let Some(On {
        gw: _gw,
        codex,
        ch,
        token,
        sid,
    }) = On::start("env-i").await
    else {
        return;
    };
    let mut procs = pb::process_service_client::ProcessServiceClient::new(ch);
    // Three lines echoed, then the end (0.169.0 has no closeStdin).
    let echo3 = "for i in 1 2 3; do read l; echo \"$l\"; done";
    let mut s = spec("cat", &["sh", "-c", echo3]);
    s.cwd = codex.work().display().to_string();
    s.pipe_stdin = true;
    let mut events = procs
        .exec(authed(
            pb::ExecRequest {
                session_id: sid.clone(),
                spec: Some(s),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut exit = None;
    for round in 0..3 {
        let line = format!("line {round}\n");
        let started = std::time::Instant::now();
        procs
            .write(authed(
                pb::WriteRequest {
                    session_id: sid.clone(),
                    process_id: "cat".into(),
                    data: line.clone().into_bytes().into(),
                    ..Default::default()
                },
                &token,
            ))
            .await
            .unwrap();
        let mut got = Vec::new();
        while got != line.as_bytes() {
            let item = tokio::time::timeout(WAIT, events.next()).await.unwrap();
            match item.unwrap().unwrap().event.and_then(|e| e.event) {
                Some(Event::Output(o)) => got.extend(o.data),
                // The executor may see the exit before it reads the last
                // output (its seq is then lower): the stream keeps its order.
                Some(Event::Exited(x)) if round == 2 => exit = Some(x.exit_code),
                other => panic!("{other:?} before the echo of {line:?}"),
            }
        }
        eprintln!("round trip {round}: {:?}", started.elapsed());
    }
    let (rest, code, closed) = drain(events, |r: pb::ExecResponse| r.event).await;
    assert_eq!((rest.as_str(), exit.or(code), closed), ("", Some(0), true));
}

/// A file streamed more slowly than the session's detach TTL (2 s here)
/// keeps its session on the executor, named or opened for the call: the
/// stream is one of the session's, as an `Attach` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_file_stream_keeps_its_executor_session() {
    let Some(On {
        gw: _gw,
        codex,
        ch,
        token,
        sid,
    }) = On::start("env-s").await
    else {
        return;
    };
    let mut files = pb::file_service_client::FileServiceClient::new(ch);
    let path = codex.work().join("slow.bin").display().to_string();
    let block: Vec<u8> = (0..1_048_576u32).map(|i| (i % 241) as u8).collect();
    for session_id in [sid.clone(), String::new()] {
        // Three messages 1.5 s apart.
        let (path, session, one) = (path.clone(), session_id.clone(), block.clone());
        let parts = futures_util::stream::iter(0..3).then(move |i| {
            let (path, session, block) = (path.clone(), session.clone(), one.clone());
            async move {
                if i > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                }
                pb::WriteFileRequest {
                    path: if i == 0 { path } else { String::new() },
                    data: block.into(),
                    session_id: if i == 0 { session } else { String::new() },
                }
            }
        });
        let wrote = files
            .write_file(authed(parts, &token))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(wrote.bytes_written, 3 * block.len() as u64);
        // Read back one 1 MiB message at a time, 1.5 s apart.
        let req = pb::ReadFileRequest {
            path: codex.work().join("slow.bin").display().to_string(),
            session_id: session_id.clone(),
            ..Default::default()
        };
        let mut s = files
            .read_file(authed(req, &token))
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(m) = tokio::time::timeout(WAIT, s.next()).await.unwrap() {
            got.extend(m.unwrap().data);
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        }
        assert_eq!(got.len(), 3 * block.len(), "{session_id:?}");
        assert!(
            got.chunks(block.len()).all(|c| c == block),
            "{session_id:?}"
        );
    }
}
