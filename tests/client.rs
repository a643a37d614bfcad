//! The client library against a real gateway, the same scenario over both
//! doors: processes (stdin, attach from a seq, terminal resize, signals),
//! files, and what another tenant or a forged token gets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Gateway;
use exec_gateway::client::{
    Client, ClientError, ConnectOptions, Event, ProcessSpec, Signal, Stream, WriteStatus,
};

fn urls(gw: &Gateway) -> [String; 2] {
    [gw.url.clone(), gw.grpc.replace("http://", "grpc://")]
}

async fn collect(c: &Client, pid: &str, after: u64) -> (Vec<u64>, Vec<u8>, Vec<u8>, Option<i32>) {
    let mut a = c.attach(pid, after).await.unwrap();
    let (mut seqs, mut out, mut err, mut code) = (vec![], vec![], vec![], None);
    while let Some(e) = a.next().await.unwrap() {
        match e {
            Event::Output { seq, stream, data } => {
                seqs.push(seq);
                match stream {
                    Stream::Stderr => err.extend_from_slice(&data),
                    _ => out.extend_from_slice(&data),
                }
            }
            Event::Exited { code: c, .. } => code = Some(c),
            Event::OutputLost { chunks } => panic!("{chunks} chunks lost"),
        }
    }
    (seqs, out, err, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_over_both_doors() {
    let gw = Gateway::start("");
    for url in urls(&gw) {
        let c = Client::connect(&url, &gw.token("t1")).await.unwrap();
        assert_eq!(c.root(), "/");

        let mut spec = ProcessSpec::new(
            "p1",
            [
                "sh",
                "-c",
                "read l; echo \"in:$l\"; echo err >&2; echo more; exit 3",
            ],
        );
        spec.cwd = "/tmp".into();
        spec.pipe_stdin = true;
        c.start(&spec).await.unwrap();
        assert_eq!(c.write("p1", b"hi\n").await.unwrap(), WriteStatus::Accepted);
        let (seqs, out, err, code) = collect(&c, "p1", 0).await;
        assert_eq!(
            (out.as_slice(), err.as_slice()),
            (&b"in:hi\nmore\n"[..], &b"err\n"[..]),
            "{url}"
        );
        assert_eq!(code, Some(3), "{url}");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{url}: {seqs:?}");
        // Attached again after the first chunk: only what followed it.
        let (later, ..) = collect(&c, "p1", seqs[0]).await;
        assert_eq!(later, seqs[1..], "{url}");
        // A start of a retained id is refused, not taken for a retry.
        let e = c.start(&spec).await.unwrap_err();
        assert!(e.is_already_exists(), "{url}: {e}");

        // A terminal follows a resize.
        let mut tty = ProcessSpec::new("t1", ["sh", "-c", "read x; stty size"]);
        tty.cwd = "/tmp".into();
        tty.tty = true;
        c.start(&tty).await.unwrap();
        c.resize("t1", 50, 132).await.unwrap();
        c.write("t1", b"\n").await.unwrap();
        let (_, out, _, _) = collect(&c, "t1", 0).await;
        assert!(
            String::from_utf8_lossy(&out).contains("50 132"),
            "{url}: {out:?}"
        );
        // A pipe process cannot be resized.
        let e = c.resize("p1", 10, 10).await.unwrap_err();
        assert!(e.to_string().contains("not a pty"), "{url}: {e}");

        // Signals reach the process group; `wait` gives the code.
        let mut s = ProcessSpec::new(
            "s1",
            [
                "sh",
                "-c",
                "trap 'exit 7' USR1; echo ready; while :; do sleep 0.05; done",
            ],
        );
        s.cwd = "/tmp".into();
        let mut a = c.exec(&s).await.unwrap();
        match a.next().await.unwrap() {
            Some(Event::Output { data, .. }) => assert_eq!(&data[..], b"ready\n"),
            other => panic!("{url}: {other:?}"),
        }
        c.signal("s1", Signal::User1).await.unwrap();
        assert_eq!(c.wait("s1").await.unwrap(), 7, "{url}");
        // A signal death is 128 + n on both doors (gRPC says which signal).
        let mut k = ProcessSpec::new("k1", ["sh", "-c", "kill -TERM $$"]);
        k.cwd = "/tmp".into();
        c.start(&k).await.unwrap();
        assert_eq!(c.wait("k1").await.unwrap(), 128 + libc::SIGTERM, "{url}");
        let listed = c.list().await.unwrap();
        let ids: Vec<&str> = listed.iter().map(|p| p.process_id.as_str()).collect();
        assert_eq!(ids, ["k1", "p1", "s1", "t1"], "{url}");
        assert!(!c.terminate("p1").await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_over_both_doors() {
    let gw = Gateway::start("");
    let dir = common::scratch();
    let blob: Vec<u8> = (0..3 * 1024 * 1024 + 333)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    for (i, url) in urls(&gw).iter().enumerate() {
        let c = Client::connect(url, &gw.token("t1")).await.unwrap();
        let sub = format!("{}/d{i}/inner", dir.path().display());
        c.create_directory(&sub, true).await.unwrap();
        let path = format!("{sub}/blob.bin");
        assert_eq!(
            c.write_file(&path, blob.clone()).await.unwrap(),
            blob.len() as u64
        );
        assert_eq!(c.read_file(&path).await.unwrap(), blob, "{url}");
        let m = c.metadata(&path).await.unwrap();
        assert!(
            m.is_file && !m.is_directory && m.size == blob.len() as u64,
            "{url}: {m:?}"
        );
        let names: Vec<String> = c
            .read_directory(&sub)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.file_name)
            .collect();
        assert_eq!(names, ["blob.bin"]);
        // An empty file.
        c.write_file(&format!("{sub}/empty"), vec![]).await.unwrap();
        assert_eq!(c.read_file(&format!("{sub}/empty")).await.unwrap(), b"");
        c.remove(&format!("{}/d{i}", dir.path().display()), true, false)
            .await
            .unwrap();
        let e = c.metadata(&path).await.unwrap_err();
        assert!(e.is_not_found(), "{url}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tenants_and_forged_tokens_get_nothing() {
    let gw = Gateway::start("");
    for url in urls(&gw) {
        let c = Client::connect(&url, &gw.token("t1")).await.unwrap();
        let mut spec = ProcessSpec::new("mine", ["sleep", "30"]);
        spec.cwd = "/tmp".into();
        c.start(&spec).await.unwrap();

        // t2 naming t1's session: as unknown as a made-up id.
        let mut o = ConnectOptions::new(&url, &gw.token("t2"));
        o.resume_session = Some(c.session_id().to_owned());
        let e = Client::connect_with(o).await.err().expect("refused");
        assert!(e.to_string().contains("unknown session"), "{url}: {e}");

        // A token signed with another key never gets a session.
        let forged = common::mint(&common::random_secret(), "t1", common::ALL_SCOPES);
        let e = Client::connect(&url, &forged).await.err().expect("refused");
        assert!(matches!(e, ClientError::Connect { .. }), "{url}: {e}");
        assert!(e.to_string().contains("invalid signature"), "{url}: {e}");
        assert!(c.terminate("mine").await.unwrap());
    }
}
