//! process/* over a real websocket with real children (docs/protocol.md,
//! "Processes"): seq rules, the read algorithm, stdin, PTYs, env, termination of
//! whole trees, retention, large output, sessions, and slow clients.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Gateway, b64, eventually, pid_alive, unb64};
use serde_json::json;

#[tokio::test]
async fn output_exit_and_close_take_contiguous_seqs_in_order() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.start("p", &["sh", "-c", "echo out; echo err >&2; exit 3"])
        .await;
    let got = c.collect("p").await;
    assert_eq!(got.stdout, b"out\n");
    assert_eq!(got.stderr, b"err\n");
    assert_eq!(got.exit_code, Some(3));
    let n = got.seqs.len() as u64;
    assert_eq!(
        got.seqs,
        (1..=n).collect::<Vec<_>>(),
        "in order, from 1, no gaps"
    );
    // Reading after close: everything retained, and the reference's nextSeq.
    let r = c.call("process/read", json!({"processId":"p"})).await;
    assert_eq!(r["closed"], true);
    assert_eq!(r["exited"], true);
    assert_eq!(r["exitCode"], 3);
    assert_eq!(r["failure"], json!(null));
    let chunks = r["chunks"].as_array().unwrap();
    assert_eq!(chunks.len() as u64, n - 2);
    // Output may take a seq after the exit's (a late stderr chunk): read
    // past the last chunk actually returned.
    let last = chunks.last().unwrap()["seq"].as_u64().unwrap();
    let r = c
        .call("process/read", json!({"processId":"p","afterSeq": last}))
        .await;
    assert_eq!(r["chunks"], json!([]));
    assert_eq!(r["nextSeq"], n + 1);
    let r = c
        .call("process/read", json!({"processId":"p","afterSeq": 99}))
        .await;
    assert_eq!(r["nextSeq"], n + 1, "not clamped");
}

#[tokio::test]
async fn read_long_poll_wakes_on_output_and_honours_max_bytes() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.call(
        "process/start",
        json!({"processId":"cat","argv":["cat"],"cwd":"/tmp","env":{},"tty":false,"pipeStdin":true}),
    )
    .await;
    // Nothing yet: a zero-wait read returns at once with nextSeq 1.
    let r = c.call("process/read", json!({"processId":"cat"})).await;
    assert_eq!(
        r,
        json!({"chunks":[],"nextSeq":1,"exited":false,"exitCode":null,"closed":false,"failure":null})
    );
    let read_id = c
        .request_id(
            "process/read",
            json!({"processId":"cat","afterSeq":0,"waitMs":15_000}),
        )
        .await;
    let w = c
        .call(
            "process/write",
            json!({"processId":"cat","chunk": b64(b"hello\n")}),
        )
        .await;
    assert_eq!(w, json!({"status":"accepted"}));
    let r = c.response(read_id).await;
    assert_eq!(
        unb64(r["result"]["chunks"][0]["chunk"].as_str().unwrap()),
        b"hello\n"
    );
    assert_eq!(r["result"]["nextSeq"], 2);
    // maxBytes: the first chunk always comes, the next one only if it fits.
    c.call(
        "process/write",
        json!({"processId":"cat","chunk": b64(b"abc\n")}),
    )
    .await;
    eventually_read(&mut c, "cat", 2).await;
    let r = c
        .call("process/read", json!({"processId":"cat","maxBytes":1}))
        .await;
    assert_eq!(r["chunks"].as_array().unwrap().len(), 1);
    assert_eq!(r["nextSeq"], 2);
    c.call("process/closeStdin", json!({"processId":"cat"}))
        .await;
    let got = c.collect("cat").await;
    assert_eq!(got.exit_code, Some(0));
    // After close the stdin channel is gone: the reference's -32603.
    let (code, msg) = c
        .call_err(
            "process/write",
            json!({"processId":"cat","chunk": b64(b"late")}),
        )
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32603, "failed to write to process stdin")
    );
}

async fn eventually_read(c: &mut common::Client, id: &str, chunks: usize) {
    for _ in 0..500 {
        let r = c.call("process/read", json!({"processId": id})).await;
        if r["chunks"].as_array().unwrap().len() >= chunks {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never produced {chunks} chunks");
}

#[tokio::test]
async fn write_statuses_and_write_id_dedup() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let w = c
        .call("process/write", json!({"processId":"nope","chunk":""}))
        .await;
    assert_eq!(w, json!({"status":"unknownProcess"}));
    c.start("nostdin", &["sleep", "30"]).await;
    let w = c
        .call(
            "process/write",
            json!({"processId":"nostdin","chunk": b64(b"x")}),
        )
        .await;
    assert_eq!(w, json!({"status":"stdinClosed"}));
    c.call(
        "process/start",
        json!({"processId":"cat","argv":["cat"],"cwd":"/tmp","env":{},"tty":false,"pipeStdin":true}),
    )
    .await;
    for _ in 0..3 {
        let w = c
            .call(
                "process/write",
                json!({"processId":"cat","chunk": b64(b"once\n"),"writeId":"w1"}),
            )
            .await;
        assert_eq!(w, json!({"status":"accepted"}));
    }
    c.call(
        "process/write",
        json!({"processId":"cat","chunk": b64(b"twice\n"),"writeId":"w2"}),
    )
    .await;
    c.call("process/closeStdin", json!({"processId":"cat"}))
        .await;
    let got = c.collect("cat").await;
    assert_eq!(got.stdout, b"once\ntwice\n");
    c.call("process/terminate", json!({"processId":"nostdin"}))
        .await;
}

#[tokio::test]
async fn duplicate_ids_are_rejected_until_evicted() {
    let gw = Gateway::start("[exec]\nexited_retention = \"1s\"\n");
    let (mut c, _) = gw.session().await;
    c.start("d", &["true"]).await;
    let (code, msg) = c
        .call_err(
            "process/start",
            json!({"processId":"d","argv":["true"],"cwd":"/tmp","env":{},"tty":false}),
        )
        .await;
    assert_eq!((code, msg.as_str()), (-32600, "process d already exists"));
    c.collect("d").await;
    // Closed but retained: still a duplicate.
    let (code, _) = c
        .call_err(
            "process/start",
            json!({"processId":"d","argv":["true"],"cwd":"/tmp","env":{},"tty":false}),
        )
        .await;
    assert_eq!(code, -32600);
    // After the retention period the id is unknown and free again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (code, msg) = c.call_err("process/read", json!({"processId":"d"})).await;
    assert_eq!((code, msg.as_str()), (-32600, "unknown process id d"));
    c.start("d", &["true"]).await;
    let (code, msg) = c.call_err("process/read", json!({"processId":"zzz"})).await;
    assert_eq!((code, msg.as_str()), (-32600, "unknown process id zzz"));
    // Spawn failures are -32603 with the OS text.
    let (code, msg) = c
        .call_err(
            "process/start",
            json!({"processId":"x","argv":["/no/such/bin"],"cwd":"/tmp","env":{},"tty":false}),
        )
        .await;
    assert_eq!(
        (code, msg.as_str()),
        (-32603, "No such file or directory (os error 2)")
    );
    let (code, _) = c
        .call_err(
            "process/start",
            json!({"processId":"y","argv":["true"],"cwd":"/no/such/dir","env":{},"tty":true}),
        )
        .await;
    assert_eq!(code, -32603);
    // A failed start leaves the id free.
    c.start("x", &["true"]).await;
}

#[tokio::test]
async fn env_is_replaced_and_policy_never_leaks_the_gateway_env() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.call(
        "process/start",
        json!({"processId":"e","argv":["/usr/bin/env"],"cwd":"/tmp","env":{"ONLY":"1"},"tty":false}),
    )
    .await;
    assert_eq!(c.collect("e").await.stdout, b"ONLY=1\n");
    // The gateway was started with the test's environment (which has HOME,
    // CARGO_* and more); `inherit: all` must see only the base environment.
    c.call(
        "process/start",
        json!({"processId":"p","argv":["/usr/bin/env"],"cwd":"/tmp","env":{"FOO":"overlay"},"tty":false,
               "envPolicy":{"inherit":"all","ignoreDefaultExcludes":false,"exclude":[],
                            "set":{"FOO":"policy","BAR":"set"},"includeOnly":[]}}),
    )
    .await;
    let out = String::from_utf8(c.collect("p").await.stdout).unwrap();
    assert!(
        out.contains("FOO=overlay\n") && out.contains("BAR=set\n"),
        "{out}"
    );
    assert!(out.contains("PATH="), "{out}");
    assert!(!out.contains("CARGO"), "gateway env leaked: {out}");
}

#[tokio::test]
async fn arg0_sets_argv0_in_pipe_mode() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.call(
        "process/start",
        json!({"processId":"a","argv":["/bin/sh","-c","tr '\\0' ' ' < /proc/$$/cmdline"],
               "cwd":"/tmp","env":{},"tty":false,"arg0":"myname"}),
    )
    .await;
    let out = String::from_utf8(c.collect("a").await.stdout).unwrap();
    assert!(out.starts_with("myname -c "), "{out}");
}

#[tokio::test]
async fn pty_echo_resize_and_stream_name() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.call(
        "process/start",
        json!({"processId":"t","argv":["sh","-c","stty size; read line; echo got:$line; stty size"],
               "cwd":"/tmp","env":{"PATH":"/usr/bin:/bin"},"tty":true}),
    )
    .await;
    let first = c
        .wait_for("pty output", |v| {
            v["method"] == "process/output" && v["params"]["processId"] == "t"
        })
        .await;
    assert_eq!(first["params"]["stream"], "pty");
    let mut seen = unb64(first["params"]["chunk"].as_str().unwrap());
    while !String::from_utf8_lossy(&seen).contains("24 80") {
        let v = c
            .wait_for("pty output", |v| {
                v["method"] == "process/output" && v["params"]["processId"] == "t"
            })
            .await;
        seen.extend(unb64(v["params"]["chunk"].as_str().unwrap()));
    }
    c.call(
        "process/resize",
        json!({"processId":"t","rows":40,"cols":100}),
    )
    .await;
    let w = c
        .call(
            "process/write",
            json!({"processId":"t","chunk": b64(b"hello\n")}),
        )
        .await;
    assert_eq!(w["status"], "accepted");
    let got = c.collect("t").await;
    let text = String::from_utf8_lossy(&got.stdout);
    assert!(text.contains("got:hello"), "{text}");
    assert!(text.contains("40 100"), "{text}");
    assert!(got.stderr.is_empty(), "a pty has no stderr");
    assert_eq!(got.exit_code, Some(0));
    let (code, _) = c
        .call_err(
            "process/resize",
            json!({"processId":"nope","rows":1,"cols":1}),
        )
        .await;
    assert_eq!(code, -32600);
}

#[tokio::test]
async fn terminate_kills_the_whole_tree() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.start(
        "tree",
        &[
            "sh",
            "-c",
            "sleep 300 & echo $!; sh -c 'sleep 300 & echo $!; wait' & wait",
        ],
    )
    .await;
    let mut text = String::new();
    while text.lines().count() < 2 {
        let v = c
            .wait_for("pids", |v| {
                v["method"] == "process/output" && v["params"]["processId"] == "tree"
            })
            .await;
        text.push_str(&String::from_utf8_lossy(&unb64(
            v["params"]["chunk"].as_str().unwrap(),
        )));
    }
    let pids: Vec<i32> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert!(pids.iter().all(|p| pid_alive(*p)));
    let r = c
        .call("process/terminate", json!({"processId":"tree"}))
        .await;
    assert_eq!(r, json!({"running": true}));
    let got = c.collect("tree").await;
    assert_eq!(
        got.exit_code,
        Some(-1),
        "pipe mode reports -1 after terminate"
    );
    for pid in pids {
        eventually("grandchild dies", || !pid_alive(pid)).await;
    }
    let r = c
        .call("process/terminate", json!({"processId":"tree"}))
        .await;
    assert_eq!(r, json!({"running": false}));
    let r = c
        .call("process/terminate", json!({"processId":"nope"}))
        .await;
    assert_eq!(r, json!({"running": false}));
}

#[tokio::test]
async fn signals_reach_the_process_group() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.start(
        "s",
        &[
            "sh",
            "-c",
            "trap 'echo got-usr1; exit 7' USR1; echo ready; while :; do sleep 0.05; done",
        ],
    )
    .await;
    c.wait_for("ready", |v| {
        v["method"] == "process/output" && v["params"]["processId"] == "s"
    })
    .await;
    assert_eq!(
        c.call("process/signal", json!({"processId":"s","signal":"user1"}))
            .await,
        json!({})
    );
    let got = c.collect("s").await;
    assert!(String::from_utf8_lossy(&got.stdout).contains("got-usr1"));
    assert_eq!(got.exit_code, Some(7));
    let (code, _) = c
        .call_err("process/signal", json!({"processId":"s","signal":"bogus"}))
        .await;
    assert_eq!(code, -32602);
}

#[tokio::test]
async fn fifty_mib_of_output_arrives_complete() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let n = 50 * 1024 * 1024;
    c.start("big", &["head", "-c", &n.to_string(), "/dev/urandom"])
        .await;
    let got = c.collect("big").await;
    assert_eq!(got.stdout.len(), n);
    assert_eq!(got.exit_code, Some(0));
    let k = got.seqs.len() as u64;
    assert_eq!(got.seqs, (1..=k).collect::<Vec<_>>());
}

#[tokio::test]
async fn retention_keeps_the_newest_mebibyte() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    c.start("r", &["head", "-c", "3000000", "/dev/zero"]).await;
    let got = c.collect("r").await;
    assert_eq!(got.stdout.len(), 3_000_000);
    let r = c
        .call("process/read", json!({"processId":"r","afterSeq":0}))
        .await;
    let chunks = r["chunks"].as_array().unwrap();
    let first_seq = chunks[0]["seq"].as_u64().unwrap();
    assert!(first_seq > 1, "the oldest chunks were evicted");
    let kept: usize = chunks
        .iter()
        .map(|c| unb64(c["chunk"].as_str().unwrap()).len())
        .sum();
    // At most the newest MiB (as the reference), less than one read chunk
    // (256 KiB) short of it.
    assert!(kept <= 1024 * 1024, "{kept}");
    assert!(kept > 1024 * 1024 - 256 * 1024, "{kept}");
    // The retained chunks are the newest ones, contiguous up to the exit.
    let last = chunks.last().unwrap()["seq"].as_u64().unwrap();
    assert_eq!(r["nextSeq"].as_u64().unwrap(), last + 1);
}

#[tokio::test]
async fn sessions_resume_and_detached_output_is_readable() {
    let gw = Gateway::start("");
    let (mut c, sid) = gw.session().await;
    c.start(
        "bg",
        &["sh", "-c", "sleep 0.5; echo while-detached; sleep 300"],
    )
    .await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let mut c2 = gw.connect().await;
    let r = c2
        .call(
            "initialize",
            json!({"clientName":"t","resumeSessionId": sid}),
        )
        .await;
    assert_eq!(r["sessionId"], sid);
    c2.send(&json!({"method":"initialized"})).await;
    let r = c2.call("process/read", json!({"processId":"bg"})).await;
    assert_eq!(
        unb64(r["chunks"][0]["chunk"].as_str().unwrap()),
        b"while-detached\n"
    );
    // Attached elsewhere: a third connection cannot take it.
    let mut c3 = gw.connect().await;
    let (code, msg) = c3
        .call_err(
            "initialize",
            json!({"clientName":"t","resumeSessionId": sid}),
        )
        .await;
    assert_eq!(
        (code, msg),
        (
            -32600,
            format!("session {sid} is already attached to another connection")
        )
    );
    // Unknown ids fail and the connection may retry initialize.
    let (_, msg) = c3
        .call_err(
            "initialize",
            json!({"clientName":"t","resumeSessionId":"nope"}),
        )
        .await;
    assert_eq!(msg, "unknown session id nope");
    c3.initialize().await;
    c2.call("process/terminate", json!({"processId":"bg"}))
        .await;
}

#[tokio::test]
async fn detach_ttl_kills_the_session_processes() {
    let gw = Gateway::start("[server]\ndetach_ttl = \"500ms\"\n");
    let (mut c, sid) = gw.session().await;
    c.start("p", &["sh", "-c", "echo $$; exec sleep 300"]).await;
    let v = c
        .wait_for("pid", |v| {
            v["method"] == "process/output" && v["params"]["processId"] == "p"
        })
        .await;
    let pid: i32 = String::from_utf8(unb64(v["params"]["chunk"].as_str().unwrap()))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(pid));
    drop(c);
    eventually("TTL kills the detached session's process", || {
        !pid_alive(pid)
    })
    .await;
    let mut c2 = gw.connect().await;
    let (_, msg) = c2
        .call_err(
            "initialize",
            json!({"clientName":"t","resumeSessionId": sid}),
        )
        .await;
    assert_eq!(msg, format!("unknown session id {sid}"));
}

#[tokio::test]
async fn a_client_that_stops_reading_does_not_stall_others_or_grow_memory() {
    let gw = Gateway::start("[server]\nslow_client_timeout = \"2s\"\n");
    let (mut slow, sid) = gw.session().await;
    // 2 GiB of output the slow client will never read.
    slow.start("flood", &["head", "-c", "2147483648", "/dev/zero"])
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Others are served meanwhile.
    for _ in 0..20 {
        let (mut other, _) = gw.session().await;
        other.start("t", &["true"]).await;
        assert_eq!(other.collect("t").await.exit_code, Some(0));
    }
    let rss_kib = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let rss = rss_kib(gw.child.id());
    assert!(
        rss < 256 * 1024,
        "gateway RSS {rss} KiB while a client stalls"
    );
    // The stalled connection is closed after the slow-client timeout; the
    // session detaches and can be resumed (nothing lost but what retention drops).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut again = gw.connect().await;
    let r = again
        .call(
            "initialize",
            json!({"clientName":"t","resumeSessionId": sid}),
        )
        .await;
    assert_eq!(r["sessionId"], sid);
    again.send(&json!({"method":"initialized"})).await;
    again
        .call("process/terminate", json!({"processId":"flood"}))
        .await;
    drop(slow);
}

/// A closed process holds no descriptor of the gateway's while it is
/// retained (its pidfd is given back at close): before, every short
/// process held one for the retention period, and 20,000 of them within
/// it ran the gateway out of descriptors.
#[tokio::test]
async fn closed_processes_hold_no_gateway_descriptors_while_retained() {
    let gw = Gateway::start("");
    let (mut c, _) = gw.session().await;
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", gw.child.id()))
            .unwrap()
            .count()
    };
    // Warm up (workers, pools), then count.
    for i in 0..5 {
        c.start(&format!("w{i}"), &["true"]).await;
        c.collect(&format!("w{i}")).await;
    }
    let before = fds();
    for i in 0..60 {
        // Half on a terminal: the PTY master is given back too.
        c.call(
            "process/start",
            json!({"processId": format!("p{i}"), "argv": ["true"], "cwd": "/tmp",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": i % 2 == 0}),
        )
        .await;
        c.collect(&format!("p{i}")).await;
    }
    // All 60 are closed and retained (retention is 30 s or more); a
    // closed terminal process still answers a resize.
    c.call(
        "process/resize",
        json!({"processId": "p0", "rows": 30, "cols": 100}),
    )
    .await;
    assert_eq!(
        c.call("process/list", json!({})).await["processes"]
            .as_array()
            .unwrap()
            .len(),
        65
    );
    let after = fds();
    assert!(
        after < before + 20,
        "60 closed processes grew the gateway's descriptors from {before} to {after}"
    );
}

/// A closed session gives back its processes' retained output at once
/// (the tenant's `max_retained_output_bytes` counts it), not when a detach
/// timer would have run out: a session that had once been detached (a
/// dropped connection, resumed; every gRPC session) used to be held by its
/// timer for the detach TTL after it was closed, and a tenant that closed
/// sessions as it went could pin (and be refused for) output nobody could
/// read any more.
#[tokio::test]
async fn closing_a_session_releases_its_retained_output_at_once() {
    let gw = Gateway::start("[server]\ndetach_ttl = \"10m\"\n");
    let retained = || gw.metric("exec_gateway_retained_output_bytes", "tenant=\"t1\"");
    let (mut c, sid) = gw.session().await;
    c.start("p", &["head", "-c", "300000", "/dev/zero"]).await;
    assert_eq!(c.collect("p").await.stdout.len(), 300_000);
    let held = retained().await.unwrap();
    assert!(held >= 300_000.0, "retained {held}");
    // The connection drops (the session is detached) and is resumed.
    drop(c);
    let mut c = gw.connect().await;
    c.resume(&sid).await;
    c.call("session/close", json!({})).await;
    drop(c);
    let deadline = tokio::time::Instant::now() + common::EVENT_TIMEOUT;
    loop {
        let now = retained().await.unwrap();
        if now == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} bytes still retained for a closed session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The quota follows: the whole budget is free for a new session.
    let (mut c, _) = gw.session().await;
    c.start("q", &["true"]).await;
    assert_eq!(c.collect("q").await.exit_code, Some(0));
}

/// Closing a session ends its processes for the gateway even when a
/// process of another session holds their output pipes open (found by the
/// attack review: the closed session's processes and their retained
/// output stayed counted, unreachable, until the holder died).
#[tokio::test]
async fn a_closed_sessions_processes_end_though_another_session_holds_their_pipes() {
    let gw = Gateway::start("");
    let running = || gw.metric("exec_gateway_processes_running", "tenant=\"t1\"");
    let (mut a, _) = gw.session().await;
    a.start("p", &["sh", "-c", "echo $$; exec sleep 60"]).await;
    let pid = a.first_line("p").await.trim().to_owned();
    let (mut b, _) = gw.session().await;
    let hold = format!("exec 3>/proc/{pid}/fd/1; echo held; exec sleep 60");
    b.start("holder", &["sh", "-c", &hold]).await;
    assert_eq!(b.first_line("holder").await.trim(), "held");
    assert_eq!(running().await, Some(2.0));
    a.call("session/close", json!({})).await;
    drop(a);
    let deadline = tokio::time::Instant::now() + common::EVENT_TIMEOUT;
    while running().await != Some(1.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed session's process is still counted: {:?}",
            running().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Both revisions' clients send the same `initialize`, so a resume of a
/// session that has not yet told its revision (no path sent) is answered
/// as today's Codex answers it: -32010, not May's -32600.
#[tokio::test]
async fn a_resume_conflict_on_an_untold_session_answers_as_current_codex() {
    let gw = Gateway::start("");
    let (_c1, sid) = gw.session().await;
    let mut c2 = gw.connect().await;
    let (code, msg) = c2
        .call_err(
            "initialize",
            json!({"clientName":"t","resumeSessionId": sid}),
        )
        .await;
    assert_eq!(
        (code, msg),
        (
            -32010,
            format!("session {sid} is already attached to another connection")
        )
    );
}
