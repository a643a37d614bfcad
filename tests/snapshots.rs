//! Workspace snapshots and forks (docs/snapshots.md): a session's
//! workspace captured while its processes run, forks that each see the
//! snapshot and only their own changes, bounds, and one tenant's
//! snapshots kept from another's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{Client, Gateway, mint};
use serde_json::{Value, json};

const SCOPES: &str = "exec fs:read fs:write snapshot";

/// A gateway with tenants `a` and `b` (roots of their own) and
/// `[snapshots]` as `bounds` says; the store inside the gateway's
/// directory. None (the reason printed) where forks cannot run here.
fn gateway(bounds: &str) -> Option<Gateway> {
    gateway_with("", bounds)
}

/// [`gateway`] with `extra` configuration before it (`[isolation]`).
fn gateway_with(extra: &str, bounds: &str) -> Option<Gateway> {
    if let Some(why) = unsupported() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Gateway::start_with(|d| {
        for t in ["a", "b"] {
            std::fs::create_dir_all(d.join(t)).unwrap();
        }
        format!(
            "{extra}[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [snapshots]\nstore = \"{d}/snapshots\"\n{bounds}\n\
             [tenants.a]\nroot = \"{d}/a\"\n\
             [tenants.b]\nroot = \"{d}/b\"\n",
            d = d.display(),
        )
    }))
}

/// Whether this machine can run tenants with the namespaces and workers
/// layers (forks need them); the reason if not.
fn unsupported() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("forks need the namespaces layer (root)");
    }
    None
}

async fn client(gw: &Gateway, tenant: &str) -> Client {
    Client::connect(&gw.url, &mint(&gw.secret, tenant, SCOPES)).await
}

async fn session(gw: &Gateway, tenant: &str) -> Client {
    let mut c = client(gw, tenant).await;
    c.initialize().await;
    c
}

/// A new session of `tenant` whose workspace is a fork of `snapshot`.
async fn fork(gw: &Gateway, tenant: &str, snapshot: &str) -> Client {
    let mut c = client(gw, tenant).await;
    c.call(
        "initialize",
        json!({"clientName": "t", "snapshot": snapshot}),
    )
    .await;
    c.send(&json!({"method": "initialized"})).await;
    c
}

fn root(gw: &Gateway, tenant: &str) -> String {
    gw.dir.path().join(tenant).display().to_string()
}

async fn read(c: &mut Client, path: &str) -> Result<String, String> {
    let r = c.call_raw("fs/readFile", json!({"path": path})).await;
    match r.get("result") {
        Some(v) => Ok(String::from_utf8(common::unb64(v["dataBase64"].as_str().unwrap())).unwrap()),
        None => Err(r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()),
    }
}

async fn snapshot(c: &mut Client, params: Value) -> Value {
    c.call("gateway/snapshot/create", params).await
}

#[tokio::test]
async fn forks_see_the_snapshot_and_only_their_own_changes() {
    let Some(gw) = gateway("") else {
        return;
    };
    let r = root(&gw, "a");
    let mut origin = session(&gw, "a").await;
    origin.write_text(&format!("{r}/f"), "orig").await;
    let (out, code) = origin
        .sh(
            "mk",
            &r,
            "mkdir -p d/e && echo deep > d/e/g && ln -s f link && chmod 640 f",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let snap = snapshot(
        &mut origin,
        json!({"name": "before the fix", "labels": {"step": "1"}}),
    )
    .await;
    let id = snap["id"].as_str().unwrap().to_owned();
    assert_eq!(snap["name"], "before the fix");
    assert_eq!(snap["labels"]["step"], "1");
    assert!(
        snap["digest"].as_str().unwrap().starts_with("sha256:"),
        "{snap}"
    );
    assert!(snap["entries"].as_u64().unwrap() >= 5, "{snap}");
    // The original moves on; the snapshot does not.
    origin.write_text(&format!("{r}/f"), "later").await;

    let mut forks = Vec::new();
    for n in 0..8 {
        let mut c = fork(&gw, "a", &id).await;
        assert_eq!(
            read(&mut c, &format!("{r}/f")).await.unwrap(),
            "orig",
            "fork {n}"
        );
        let (out, code) = c
            .sh(
                "w",
                &r,
                &format!("cat d/e/g link && echo fork{n} > f && id -u"),
            )
            .await;
        assert_eq!(code, 0, "fork {n}: {out}");
        assert!(out.starts_with("deep\norig"), "fork {n}: {out}");
        forks.push(c);
    }
    for (n, c) in forks.iter_mut().enumerate() {
        assert_eq!(
            read(c, &format!("{r}/f")).await.unwrap(),
            format!("fork{n}\n")
        );
    }
    assert_eq!(read(&mut origin, &format!("{r}/f")).await.unwrap(), "later");
    assert_eq!(
        std::fs::read_to_string(Path::new(&r).join("f")).unwrap(),
        "later",
        "a fork wrote the tenant's own root"
    );

    // A fork's own workspace snapshots, and forks, like the root.
    let again = snapshot(&mut forks[0], json!({"name": "fork of a fork"})).await;
    let mut deeper = fork(&gw, "a", again["id"].as_str().unwrap()).await;
    let (out, code) = deeper
        .sh("deeper", &r, "cat d/e/g f link; stat -c %a f")
        .await;
    assert_eq!((out.as_str(), code), ("deep\nfork0\nfork0\n640\n", 0));
    assert_eq!(again["image"], snap["image"]);
    drop(deeper);

    // Deleted, the snapshot is gone for new forks; the live ones keep it.
    origin
        .call("gateway/snapshot/delete", json!({"snapshotId": id}))
        .await;
    let (_, msg) = client(&gw, "a")
        .await
        .call_err("initialize", json!({"clientName": "t", "snapshot": id}))
        .await;
    assert!(msg.contains("unknown snapshot"), "{msg}");
    let (out, code) = forks[3].sh("after", &r, "cat d/e/g f").await;
    assert_eq!((out.as_str(), code), ("deep\nfork3\n", 0));
}

/// cgroup v2: a snapshot freezes the tenant's cgroup and thaws it after
/// (the thaw written with the gateway's ids, not those of the tenant the
/// walk ran as, which `cgroup.freeze` refuses): a process that ran before
/// runs on, and new ones start.
#[tokio::test]
async fn on_cgroup_v2_the_tenant_runs_on_after_a_snapshot() {
    if common::cgroup2_mount().is_none() {
        eprintln!("SKIPPED: no cgroup2 filesystem is mounted");
        return;
    }
    let Some(gw) = gateway_with("[isolation]\ncgroup_version = \"v2\"\n", "") else {
        return;
    };
    let r = root(&gw, "a");
    let mut c = session(&gw, "a").await;
    c.call(
        "process/start",
        json!({"processId": "tick", "argv": ["/bin/sh", "-c",
            "while :; do echo x >> ticks; sleep 0.01; done"],
            "cwd": r, "env": {"PATH": "/bin:/usr/bin"}, "tty": false}),
    )
    .await;
    let (_, code) = c
        .sh("wait", &r, "while [ ! -s ticks ]; do sleep 0.01; done")
        .await;
    assert_eq!(code, 0);
    snapshot(&mut c, json!({})).await;
    let (out, code) = c.sh("after", &r, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    let (out, _) = c
        .sh(
            "grows",
            &r,
            "a=$(wc -l < ticks); sleep 0.3; b=$(wc -l < ticks); [ $b -gt $a ] && echo grows",
        )
        .await;
    assert_eq!(out, "grows\n");
}

#[tokio::test]
async fn a_snapshot_taken_while_a_writer_runs_is_consistent() {
    let Some(gw) = gateway("") else {
        return;
    };
    let r = root(&gw, "a");
    let mut origin = session(&gw, "a").await;
    // The file is always whole: written aside, renamed over.
    origin
        .call(
            "process/start",
            json!({"processId": "writer", "argv": ["/bin/sh", "-c",
                "seq 1 5000 > f; while :; do seq 1 5000 > t; mv t f; done"],
                "cwd": r, "env": {"PATH": "/bin:/usr/bin"}, "tty": false}),
        )
        .await;
    let (_, code) = origin
        .sh("wait", &r, "while [ ! -s f ]; do sleep 0.01; done")
        .await;
    assert_eq!(code, 0);
    for round in 0..5 {
        let snap = snapshot(&mut origin, json!({})).await;
        let mut c = fork(&gw, "a", snap["id"].as_str().unwrap()).await;
        let (out, code) = c.sh("check", &r, "wc -l < f; tail -n 1 f").await;
        assert_eq!((out.as_str(), code), ("5000\n5000\n", 0), "round {round}");
    }
    // The writer runs on after each capture.
    let (out, _) = origin.sh("alive", &r, "sleep 0.2; ls").await;
    assert!(out.contains('f'), "{out}");
}

#[tokio::test]
async fn snapshots_are_bounded_and_their_tenants_own() {
    let Some(gw) = gateway("max_per_tenant = 2\nmax_forks_per_tenant = 1") else {
        return;
    };
    let r = root(&gw, "a");
    let mut a = session(&gw, "a").await;
    a.write_text(&format!("{r}/x"), "x").await;
    let first = snapshot(&mut a, json!({"name": "one"})).await;
    let id = first["id"].as_str().unwrap().to_owned();
    snapshot(&mut a, json!({})).await;
    let (code, msg) = a.call_err("gateway/snapshot/create", json!({})).await;
    assert_eq!(code, -32006, "{msg}");
    assert!(msg.contains("snapshots kept by the tenant"), "{msg}");
    let list = a.call("gateway/snapshot/list", json!({})).await;
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 2, "{list}");
    assert_eq!(list["snapshots"][0]["id"], id.as_str());

    // One fork at a time.
    let _one = fork(&gw, "a", &id).await;
    let (code, msg) = client(&gw, "a")
        .await
        .call_err("initialize", json!({"clientName": "t", "snapshot": id}))
        .await;
    assert_eq!(code, -32006, "{msg}");

    // Another tenant's id answers like an unknown one, at every door.
    let mut b = session(&gw, "b").await;
    let unknown = "snap-0123456789abcdef0123456789abcdef";
    for probe in [id.as_str(), unknown] {
        let (code_get, msg_get) = b
            .call_err("gateway/snapshot/get", json!({"snapshotId": probe}))
            .await;
        let (code_del, _) = b
            .call_err("gateway/snapshot/delete", json!({"snapshotId": probe}))
            .await;
        let (code_fork, msg_fork) = client(&gw, "b")
            .await
            .call_err("initialize", json!({"clientName": "t", "snapshot": probe}))
            .await;
        assert_eq!(
            (code_get, code_del, code_fork),
            (-32600, -32600, -32600),
            "{msg_get} {msg_fork}"
        );
        assert_eq!(msg_get, format!("unknown snapshot id {probe}"));
    }
    let list = b.call("gateway/snapshot/list", json!({})).await;
    assert_eq!(list["snapshots"], json!([]));
    assert_eq!(
        a.call("gateway/snapshot/get", json!({"snapshotId": id}))
            .await["name"],
        "one"
    );

    // Without a snapshot registry there is nowhere to push; promoting
    // keeps it until it is deleted.
    let (code, msg) = a
        .call_err("gateway/snapshot/push", json!({"snapshotId": id}))
        .await;
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("no snapshot registry"), "{msg}");
    let kept = a
        .call("gateway/snapshot/promote", json!({"snapshotId": id}))
        .await;
    assert!(
        kept.get("expiresAtMs").is_none() && kept.get("pushed").is_none(),
        "{kept}"
    );
    let (code, _) = b
        .call_err("gateway/snapshot/promote", json!({"snapshotId": id}))
        .await;
    assert_eq!(code, -32600);

    // Without the scope, nothing.
    let mut c = Client::connect(&gw.url, &mint(&gw.secret, "a", "exec fs:read fs:write")).await;
    let (code, msg) = c
        .call_err("initialize", json!({"clientName": "t", "snapshot": id}))
        .await;
    assert_eq!(code, -32003, "{msg}");
    c.initialize().await;
    let (code, _) = c.call_err("gateway/snapshot/list", json!({})).await;
    assert_eq!(code, -32003);
    // Bad names and labels are refused before anything is read.
    for bad in [
        json!({"name": ""}),
        json!({"labels": {"a b": "c"}}),
        json!({"bogus": 1}),
    ] {
        let (code, msg) = a.call_err("gateway/snapshot/create", bad.clone()).await;
        assert_eq!(code, -32602, "{bad}: {msg}");
    }
}

/// The gRPC door: CreateSnapshot on a session, ForkSessions (all or
/// none), List, Get and Delete; a forked session resumed over JSON-RPC
/// works in its fork.
#[tokio::test]
async fn grpc_snapshots_and_forks() {
    use common::grpc::authed;
    use exec_gateway::transport::grpc::pb;
    use pb::session_service_client::SessionServiceClient;
    let Some(gw) = gateway("max_forks_per_tenant = 3") else {
        return;
    };
    let r = root(&gw, "a");
    let token = mint(&gw.secret, "a", SCOPES);
    let mut sessions = SessionServiceClient::new(common::grpc::channel(&gw.grpc).await);
    let mut a = client(&gw, "a").await;
    let sid = a.initialize().await;
    a.write_text(&format!("{r}/g"), "grpc").await;
    let snap = sessions
        .create_snapshot(authed(
            pb::CreateSnapshotRequest {
                session_id: sid.clone(),
                name: "over grpc".into(),
                labels: [("k".to_owned(), "v".to_owned())].into(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(
        (snap.name.as_str(), snap.labels["k"].as_str()),
        ("over grpc", "v")
    );
    let fork = |count| pb::ForkSessionsRequest {
        snapshot_id: snap.id.clone(),
        count,
    };
    // More than the tenant may have at once: none is made.
    let e = sessions
        .fork_sessions(authed(fork(4), &token))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let ids = sessions
        .fork_sessions(authed(fork(3), &token))
        .await
        .unwrap()
        .into_inner()
        .session_ids;
    assert_eq!(ids.len(), 3);
    for (n, id) in ids.iter().enumerate() {
        let mut c = client(&gw, "a").await;
        c.resume(id).await;
        assert_eq!(read(&mut c, &format!("{r}/g")).await.unwrap(), "grpc");
        c.write_text(&format!("{r}/g"), &format!("fork {n}")).await;
        assert_eq!(
            read(&mut c, &format!("{r}/g")).await.unwrap(),
            format!("fork {n}")
        );
    }
    let listed = sessions
        .list_snapshots(authed(pb::ListSnapshotsRequest {}, &token))
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].digest, snap.digest);
    // Another tenant, and a token without the scope, get nothing.
    let other = mint(&gw.secret, "b", SCOPES);
    let e = sessions
        .get_snapshot(authed(
            pb::GetSnapshotRequest {
                snapshot_id: snap.id.clone(),
            },
            &other,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = sessions
        .delete_snapshot(authed(
            pb::DeleteSnapshotRequest {
                snapshot_id: snap.id.clone(),
            },
            &other,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let unscoped = mint(&gw.secret, "a", "exec fs:read fs:write");
    let e = sessions
        .list_snapshots(authed(pb::ListSnapshotsRequest {}, &unscoped))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    sessions
        .delete_snapshot(authed(
            pb::DeleteSnapshotRequest {
                snapshot_id: snap.id.clone(),
            },
            &token,
        ))
        .await
        .unwrap();
    let e = sessions
        .get_snapshot(authed(
            pb::GetSnapshotRequest {
                snapshot_id: snap.id.clone(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}

/// Guards (attack review): a capture reads as the tenant, so a fork never
/// shows what the tenant could not read; names that are not UTF-8 are
/// skipped, not fatal; an unchanged fork snapshots to the same digest (its
/// tree is the snapshot's: modes and directory times kept).
#[tokio::test]
async fn a_fork_holds_what_the_tenant_could_read_and_nothing_else() {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::PermissionsExt as _;
    let Some(gw) = gateway("") else {
        return;
    };
    let r = root(&gw, "a");
    let mut origin = session(&gw, "a").await;
    let (out, code) = origin
        .sh("mk", &r, "mkdir -p d/e && echo mine > d/e/f && chmod 751 d")
        .await;
    assert_eq!(code, 0, "{out}");
    // Another user's private file and directory in the tenant's root.
    let secret = Path::new(&r).join("secret");
    std::fs::write(&secret, "not yours").unwrap();
    std::os::unix::fs::chown(&secret, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let hidden = Path::new(&r).join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::write(hidden.join("x"), "not yours either").unwrap();
    std::os::unix::fs::chown(&hidden, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        Path::new(&r).join(std::ffi::OsStr::from_bytes(b"bad\xffname")),
        "x",
    )
    .unwrap();
    let (_, code) = origin.sh("try", &r, "cat secret || ls hidden").await;
    assert_ne!(code, 0, "the tenant can read them: the test proves nothing");

    let snap = snapshot(&mut origin, json!({})).await;
    assert_eq!(snap["skipped"], 3, "{snap}");
    let mut c = fork(&gw, "a", snap["id"].as_str().unwrap()).await;
    let (out, code) = c.sh("look", &r, "ls -A; cat d/e/f; stat -c %a . d").await;
    assert_eq!(code, 0, "{out}");
    let root_mode = std::fs::metadata(&r).unwrap().permissions().mode() & 0o7777;
    assert_eq!(out, format!("d\nmine\n{root_mode:o}\n751\n"));
    assert!(read(&mut c, &format!("{r}/secret")).await.is_err());
    // Unchanged, the fork's workspace is the snapshot.
    let again = snapshot(&mut c, json!({})).await;
    assert_eq!(again["digest"], snap["digest"], "{again} {snap}");
}

/// Guards (attack review): bytes taken by a capture that fails are given
/// back; the tenant's share overrun is a quota error naming the limit;
/// entries the walk skips count against `max_entries`.
#[tokio::test]
async fn failed_captures_give_their_bytes_back_and_skipped_entries_count() {
    let mib = 1 << 20;
    let Some(gw) = gateway(&format!(
        "max_tenant_bytes = {}\nmax_entries = 300",
        8 * mib
    )) else {
        return;
    };
    let r = root(&gw, "a");
    let mut a = session(&gw, "a").await;
    let deep = (0..130)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join("/");
    let (out, code) = a
        .sh(
            "mk",
            &r,
            &format!("head -c 5000000 /dev/zero > big && mkdir -p {deep}"),
        )
        .await;
    assert_eq!(code, 0, "{out}");
    for _ in 0..3 {
        let (code, msg) = a.call_err("gateway/snapshot/create", json!({})).await;
        assert_eq!(code, -32602, "{msg}");
        assert!(msg.contains("deeper than"), "{msg}");
    }
    let (_, code) = a.sh("rm", &r, "rm -r d0").await;
    assert_eq!(code, 0);
    // Three failed captures of 5 MB each would leave no room for this.
    let snap = snapshot(&mut a, json!({})).await;
    assert!(snap["bytes"].as_u64().unwrap() > 5_000_000, "{snap}");
    let (_, code) = a.sh("more", &r, "head -c 5000000 /dev/zero > big2").await;
    assert_eq!(code, 0);
    let (code, msg) = a.call_err("gateway/snapshot/create", json!({})).await;
    assert_eq!(code, -32006, "{msg}");
    assert_eq!(
        msg,
        format!(
            "quota exceeded: snapshot bytes kept by the tenant (limit {})",
            8 * mib
        )
    );
    a.call("gateway/snapshot/delete", json!({"snapshotId": snap["id"]}))
        .await;
    let (_, code) = a
        .sh(
            "fifos",
            &r,
            "rm big big2; for i in $(seq 1 400); do mkfifo p$i; done",
        )
        .await;
    assert_eq!(code, 0);
    let (code, msg) = a.call_err("gateway/snapshot/create", json!({})).await;
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("more than 300 entries"), "{msg}");
}

/// Guards (attack review): a deleted snapshot's files are emptied when
/// its last fork ends, so a descriptor a tenant passed out of a fork holds
/// no store disk; and a second gateway cannot open a store in use.
#[tokio::test]
async fn a_deleted_snapshot_holds_no_disk_through_a_passed_descriptor() {
    let Some(gw) = gateway("") else {
        return;
    };
    let r = root(&gw, "a");
    let mut origin = session(&gw, "a").await;
    let (_, code) = origin.sh("mk", &r, "head -c 3000000 /dev/zero > big").await;
    assert_eq!(code, 0);
    let snap = snapshot(&mut origin, json!({})).await;
    // A holder in the original session (the tenant's /tmp is shared by
    // its sessions) takes a descriptor from the fork, and reports its
    // size when asked.
    let holder = "import os, socket, sys\n\
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
        s.bind('/tmp/holder.sock')\n\
        print('ready', flush=True)\n\
        _, fds, _, _ = socket.recv_fds(s, 16, 1)\n\
        for line in sys.stdin:\n    print(os.fstat(fds[0]).st_size, flush=True)\n";
    origin
        .call(
            "process/start",
            json!({"processId": "holder", "argv": ["python3", "-c", holder], "cwd": r,
                   "env": {"PATH": "/bin:/usr/bin"}, "tty": false, "pipeStdin": true}),
        )
        .await;
    assert_eq!(origin.first_line("holder").await, "ready");
    let sender = "import socket\n\
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
        s.connect('/tmp/holder.sock')\n\
        f = open('big', 'rb')\n\
        socket.send_fds(s, [b'x'], [f.fileno()])\n";
    let mut f = fork(&gw, "a", snap["id"].as_str().unwrap()).await;
    let (out, code) = f.sh("send", &r, &format!("python3 -c \"{sender}\"")).await;
    assert_eq!(code, 0, "{out}");
    f.call("session/close", json!({})).await;
    origin
        .call("gateway/snapshot/delete", json!({"snapshotId": snap["id"]}))
        .await;
    origin
        .call(
            "process/write",
            json!({"processId": "holder", "chunk": common::b64(b"size\n")}),
        )
        .await;
    let text = origin.first_line("holder").await;
    assert_eq!(text, "0", "the store's file kept its bytes");

    // One gateway per store.
    let store = gw.dir.path().join("snapshots");
    let second = Gateway::start_with(|d| {
        std::fs::create_dir_all(d.join("a")).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [snapshots]\nstore = \"{s}\"\n[tenants.a]\nroot = \"{d}/a\"\n",
            d = d.display(),
            s = store.display()
        )
    });
    let mut c = Client::connect(&second.url, &mint(&second.secret, "a", SCOPES)).await;
    c.initialize().await;
    let (code, msg) = c.call_err("gateway/snapshot/list", json!({})).await;
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("cannot take snapshots"), "{msg}");
    assert!(read(&mut origin, &format!("{r}/big")).await.is_ok());
}

/// `exec-gateway snapshot` over both doors: create with a name and
/// labels, list (table and JSON), get, promote, delete; an unknown id
/// fails with the gateway's words and the client's exit code.
#[tokio::test]
async fn the_cli_saves_lists_promotes_and_deletes() {
    let Some(gw) = gateway("") else {
        return;
    };
    let token = mint(&gw.secret, "a", SCOPES);
    let grpc = gw.grpc.replacen("http://", "grpc://", 1);
    let cli = |url: &str, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_exec-gateway"))
            .args(["snapshot", "--url", url, "--token", &token])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::write(Path::new(&root(&gw, "a")).join("f"), "cli").unwrap();
    for url in [gw.url.as_str(), grpc.as_str()] {
        let (code, out, err) = cli(url, &["create", "--name", "from the cli", "--label", "k=v"]);
        assert_eq!(code, Some(0), "{url}: {err}");
        let snap: Value = serde_json::from_str(out.trim()).unwrap();
        let id = snap["id"].as_str().unwrap().to_owned();
        assert_eq!(
            (snap["name"].as_str(), snap["labels"]["k"].as_str()),
            (Some("from the cli"), Some("v"))
        );
        let (_, table, _) = cli(url, &["list"]);
        let row = table
            .lines()
            .find(|l| l.starts_with(&id))
            .unwrap_or_default();
        assert!(
            row.contains("from the cli") && row.contains("retained"),
            "{table}"
        );
        let (_, json_lines, _) = cli(url, &["list", "--json"]);
        assert_eq!(json_lines.lines().count(), 1, "{json_lines}");
        let (code, got, _) = cli(url, &["get", &id]);
        assert_eq!(code, Some(0));
        assert_eq!(
            serde_json::from_str::<Value>(got.trim()).unwrap()["digest"],
            snap["digest"]
        );
        let (code, kept, _) = cli(url, &["promote", &id]);
        assert_eq!(code, Some(0));
        assert!(
            serde_json::from_str::<Value>(kept.trim())
                .unwrap()
                .get("expiresAtMs")
                .is_none()
        );
        let (code, _, _) = cli(url, &["delete", &id]);
        assert_eq!(code, Some(0));
        let (code, _, err) = cli(url, &["get", &id]);
        assert_eq!(code, Some(125), "{err}");
        assert!(err.contains("unknown snapshot id"), "{err}");
    }
    let (code, _, err) = cli(&gw.url, &["create", "--label", "novalue"]);
    assert_eq!(code, Some(125));
    assert!(err.contains("not KEY=VALUE"), "{err}");
}
