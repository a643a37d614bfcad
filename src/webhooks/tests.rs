#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn settings(name: &str, events: &[&str], tenants: Option<&[&str]>) -> EndpointSettings {
    EndpointSettings {
        name: name.to_owned(),
        url: url::Url::parse("http://127.0.0.1:9/hook").unwrap(),
        secrets: vec![Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()],
        secret_files: Vec::new(),
        events: EventFilter::parse(&events.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap(),
        tenants: tenants.map(|t| t.iter().map(|s| s.to_string()).collect()),
        timeout: DEFAULT_TIMEOUT,
        max_attempts: DEFAULT_MAX_ATTEMPTS,
        max_age: DEFAULT_MAX_AGE,
        retry_initial: DEFAULT_RETRY_INITIAL,
        retry_max: DEFAULT_RETRY_MAX,
        concurrency: 1,
        ca_file: None,
    }
}

struct Rig {
    hub: Hub,
    jobs: Receiver<Job>,
    deliveries: Vec<tokio::sync::mpsc::Receiver<Pending>>,
}

fn rig(
    spool: &std::path::Path,
    eps: Vec<EndpointSettings>,
    max_events: usize,
    max_bytes: usize,
    writer_queue: usize,
) -> Rig {
    let mut endpoints = Vec::new();
    let mut deliveries = Vec::new();
    for e in &eps {
        let dir = spool.join(&e.name);
        spool::make_dir(&dir).unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(max_events);
        endpoints.push(Arc::new(Endpoint {
            name: e.name.clone(),
            dir,
            client: ArcSwap::from_pointee(client(e).unwrap()),
            settings: ArcSwap::from_pointee(e.clone()),
            slots: tokio::sync::Semaphore::new(1),
            tx,
        }));
        deliveries.push(rx);
    }
    let (tx, jobs) = std::sync::mpsc::sync_channel(writer_queue);
    Rig {
        hub: Hub {
            spool_dir: spool.to_path_buf(),
            endpoints,
            wanted: AtomicU16::new(union(&eps)),
            tx,
            unspooled: AtomicUsize::new(0),
            queued_events: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            max_events,
            max_bytes,
            max_event_bytes: 1024,
            metrics: WebhookMetrics::default(),
        },
        jobs,
        deliveries,
    }
}

fn dropped(h: &Hub, reason: &str) -> u64 {
    h.metrics
        .dropped
        .get_or_create(&counters::DropLabel {
            reason: reason.to_owned(),
        })
        .get()
}

fn exited(h: &Hub, tenant: Option<&str>) {
    h.offer(
        "process.exited",
        [tenant, None, Some("s")],
        &serde_json::json!({"exit_code": 0}),
    );
}

#[test]
fn the_queue_holds_its_bound_in_events_and_drops_the_rest_counted() {
    let dir = tempfile::tempdir().unwrap();
    let r = rig(
        dir.path(),
        vec![settings("a", &["process.*"], None)],
        3,
        1 << 20,
        100,
    );
    for _ in 0..5 {
        exited(&r.hub, Some("t1"));
    }
    // An event the endpoint does not want is neither queued nor dropped.
    r.hub.offer(
        "session.opened",
        [Some("t1"), None, Some("s")],
        &serde_json::json!({}),
    );
    r.hub.offer(
        "file.written",
        [Some("t1"), None, None],
        &serde_json::json!({}),
    );
    assert_eq!(r.jobs.try_iter().count(), 3);
    assert_eq!(dropped(&r.hub, "queue_full"), 2);
    assert_eq!(r.hub.metrics.queue_depth.get(), 3);
}

#[test]
fn the_queue_holds_its_bound_in_bytes_and_an_oversized_event_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let one = event::body(
        "process.exited",
        std::time::SystemTime::now(),
        [
            ("tenant", Some("t1")),
            ("subject", None),
            ("session", Some("s")),
        ],
        &serde_json::json!({"exit_code": 0}),
    )
    .len();
    let r = rig(
        dir.path(),
        vec![settings("a", &["*"], None)],
        100,
        2 * one + one / 2,
        100,
    );
    for _ in 0..4 {
        exited(&r.hub, Some("t1"));
    }
    assert_eq!(r.jobs.try_iter().count(), 2);
    assert_eq!(dropped(&r.hub, "queue_full"), 2);
    let big = "x".repeat(2000);
    r.hub.offer(
        "process.exited",
        [Some("t1"), None, None],
        &serde_json::json!({"pad": big}),
    );
    assert_eq!(dropped(&r.hub, "too_large"), 1);
    assert_eq!(r.hub.queued_events.load(Ordering::Relaxed), 2);
}

#[test]
fn a_full_writer_queue_drops_and_frees_the_room_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let r = rig(
        dir.path(),
        vec![settings("a", &["*"], None), settings("b", &["*"], None)],
        100,
        1 << 20,
        1,
    );
    exited(&r.hub, Some("t1"));
    exited(&r.hub, Some("t1"));
    assert_eq!(dropped(&r.hub, "queue_full"), 2, "both endpoints' copies");
    assert_eq!(r.hub.queued_events.load(Ordering::Relaxed), 2);
    assert_eq!(r.hub.unspooled.load(Ordering::Relaxed), 1);
    let job = r.jobs.try_recv().unwrap();
    assert_eq!(job.endpoints, [0, 1]);
}

#[test]
fn an_endpoints_tenant_and_type_filters_choose_what_it_gets() {
    let dir = tempfile::tempdir().unwrap();
    let r = rig(
        dir.path(),
        vec![
            settings("all", &["*"], None),
            settings("t1", &["*"], Some(&["t1"])),
            settings("sessions", &["session.*"], None),
        ],
        100,
        1 << 20,
        100,
    );
    exited(&r.hub, Some("t1"));
    exited(&r.hub, Some("t2"));
    exited(&r.hub, None);
    r.hub.offer(
        "session.closed",
        [Some("t2"), None, Some("s")],
        &serde_json::json!({}),
    );
    let got: Vec<Vec<usize>> = r.jobs.try_iter().map(|j| j.endpoints).collect();
    assert_eq!(got, [vec![0, 1], vec![0], vec![0], vec![0, 2]]);
}

#[test]
fn the_writer_spools_before_it_hands_over_and_finishing_removes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let Rig {
        hub,
        jobs,
        mut deliveries,
    } = rig(
        dir.path(),
        vec![settings("a", &["*"], None)],
        10,
        1 << 20,
        10,
    );
    let hub: &'static Hub = Box::leak(Box::new(hub));
    exited(hub, Some("t1"));
    let writer = std::thread::spawn(move || spool_loop(hub, jobs));
    let p = deliveries[0].blocking_recv().unwrap();
    let path = p.path.clone().unwrap();
    let on_disk = spool::load(&dir.path().join("a")).unwrap();
    assert_eq!(on_disk.len(), 1);
    assert_eq!(on_disk[0].1.id, p.msg.id);
    assert_eq!(on_disk[0].1.body, p.msg.body);
    let v: Value = serde_json::from_slice(&p.msg.body).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["data"]["tenant"].as_str()),
        (Some("process.exited"), Some("t1"))
    );
    assert_eq!(hub.unspooled.load(Ordering::Relaxed), 0);
    hub.finish(p);
    assert!(!path.exists());
    assert_eq!(hub.queued_events.load(Ordering::Relaxed), 0);
    assert_eq!(hub.metrics.queue_bytes.get(), 0);
    drop(writer);
}

#[test]
fn a_spool_that_cannot_be_written_is_counted_and_the_message_still_goes() {
    let dir = tempfile::tempdir().unwrap();
    let Rig {
        hub,
        jobs,
        mut deliveries,
    } = rig(
        dir.path(),
        vec![settings("a", &["*"], None)],
        10,
        1 << 20,
        10,
    );
    std::fs::remove_dir(dir.path().join("a")).unwrap();
    let hub: &'static Hub = Box::leak(Box::new(hub));
    exited(hub, Some("t1"));
    let _writer = std::thread::spawn(move || spool_loop(hub, jobs));
    let p = deliveries[0].blocking_recv().unwrap();
    assert!(p.path.is_none());
    assert_eq!(hub.metrics.spool_errors.get(), 1);
    hub.finish(p);
    assert_eq!(hub.queued_events.load(Ordering::Relaxed), 0);
}
