//! The process table's tests: real processes through a `LocalSpawner`.

#![allow(clippy::unwrap_used)]
use super::*;
use crate::outbound::Outbound;
use crate::spawn::LocalSpawner;

fn table(settings: ExecSettings) -> (Arc<ProcessTable>, crate::outbound::FrameReceiver) {
    let attachment = Arc::new(Attachment::default());
    let (out, rx) = Outbound::channel(crate::outbound::ByteBudget::unlimited());
    let _ = attachment.attach(1, out);
    let t = ProcessTable::new(
        attachment,
        Arc::new(settings),
        Box::new(LocalSpawner { sandbox: None }),
        Arc::default(),
    );
    (t, rx)
}

fn params(id: &str, script: &str) -> ExecParams {
    let argv = ["sh", "-c", script];
    let p = serde_json::json!({"processId": id, "argv": argv, "cwd": "/", "env": {}, "tty": false});
    serde_json::from_value(p).unwrap()
}

const PROCESS: StartOptions = StartOptions {
    api: Api::Process,
    retained_cap: None,
    hold_output: false,
    audit: None,
};

async fn read_until_closed(t: &ProcessTable, id: &str) -> ReadResponse {
    let never = CancellationToken::new();
    let mut after = 0;
    let mut chunks = Vec::new();
    loop {
        let r = t
            .read(
                ReadParams {
                    process_id: id.into(),
                    after_seq: Some(after),
                    max_bytes: None,
                    wait_ms: Some(10_000),
                },
                &never,
                None,
            )
            .await
            .unwrap()
            .0;
        chunks.extend(r.chunks.clone());
        after = r.next_seq - 1;
        if r.closed {
            return ReadResponse { chunks, ..r };
        }
    }
}

#[tokio::test]
async fn a_process_runs_to_closed_with_ordered_seqs() {
    let (t, _rx) = table(ExecSettings::new(4, HashMap::new()));
    t.start(params("p", "echo out; echo err >&2; exit 3"), PROCESS)
        .await
        .unwrap();
    let r = read_until_closed(&t, "p").await;
    assert_eq!(r.exit_code, Some(3));
    let seqs: Vec<u64> = r.chunks.iter().map(|c| c.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let mut text: Vec<u8> = r.chunks.iter().flat_map(|c| c.chunk.0.clone()).collect();
    text.sort_unstable();
    let mut want = b"out\nerr\n".to_vec();
    want.sort_unstable();
    assert_eq!(text, want);
    assert_eq!(t.live_count(), 0);
}

#[tokio::test]
async fn ids_are_unique_and_the_quota_holds() {
    let (t, _rx) = table(ExecSettings::new(1, HashMap::new()));
    t.start(params("a", "sleep 5"), PROCESS).await.unwrap();
    let e = t.start(params("a", "true"), PROCESS).await.err().unwrap();
    assert_eq!(e.to_string(), "process a already exists");
    let e = t.start(params("b", "true"), PROCESS).await.err().unwrap();
    assert!(matches!(
        e,
        GatewayError::QuotaExceeded {
            quota: "processes",
            ..
        }
    ));
    assert!(t.terminate("a").running);
    let r = read_until_closed(&t, "a").await;
    assert_eq!(r.exit_code, Some(-1));
    // The slot came back with the close.
    t.start(params("b", "true"), PROCESS).await.unwrap();
}

#[tokio::test]
async fn a_process_done_starting_after_its_session_ended_is_killed() {
    // `kill_all` passes over what is still starting; whatever finishes
    // starting afterwards is killed on its way into the table.
    let (t, _rx) = table(ExecSettings::new(4, HashMap::new()));
    t.kill_all(crate::audit::KilledBy::SessionEnd);
    t.start(params("late", "sleep 30"), PROCESS).await.unwrap();
    let r = read_until_closed(&t, "late").await;
    assert_eq!(r.exit_code, Some(-1));
    assert_eq!(t.live_count(), 0);
}

#[tokio::test]
async fn closed_processes_are_forgotten_after_retention() {
    let mut s = ExecSettings::new(4, HashMap::new());
    s.exited_retention = Some(Duration::from_millis(50));
    let (t, _rx) = table(s);
    t.start(params("p", "true"), PROCESS).await.unwrap();
    read_until_closed(&t, "p").await;
    assert_eq!(t.list().processes.len(), 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(matches!(t.get("p"), Err(GatewayError::UnknownId(_))));
    assert!(t.list().processes.is_empty());
}

#[tokio::test]
async fn stdin_write_ids_are_not_written_twice() {
    let (t, _rx) = table(ExecSettings::new(4, HashMap::new()));
    let mut p = params("p", "cat");
    p.pipe_stdin = true;
    t.start(p, PROCESS).await.unwrap();
    for _ in 0..2 {
        let w = t
            .write(WriteParams {
                process_id: "p".into(),
                chunk: ByteChunk(b"once\n".to_vec()),
                write_id: Some("w1".into()),
            })
            .await
            .unwrap();
        assert_eq!(w.status, WriteStatus::Accepted);
    }
    t.close_stdin("p").await.unwrap();
    let r = read_until_closed(&t, "p").await;
    let out: Vec<u8> = r.chunks.iter().flat_map(|c| c.chunk.0.clone()).collect();
    assert_eq!(out, b"once\n");
    let w = t
        .write(WriteParams {
            process_id: "nope".into(),
            chunk: ByteChunk(Vec::new()),
            write_id: None,
        })
        .await
        .unwrap();
    assert_eq!(w.status, WriteStatus::UnknownProcess);
}
