//! Images (docs/environments.md): tenants and sessions whose processes see
//! an OCI image as `/`, pulled from a real registry (Debian's
//! `docker-registry`, images pushed with `skopeo`) or imported from a
//! layout; the store shared, bounded and hostile-proof.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::oci::{self, Entry, Layer, StoreState, TestRegistry, Unmounts, layer};
use common::{Client, Gateway};
use serde_json::json;

/// The registry and the tools, or why this test cannot run here.
fn registry() -> Option<TestRegistry> {
    if let Some(why) = oci::registry_missing() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(TestRegistry::start())
}

/// A test's scratch directory, the image store's path in it (outside
/// the gateway's directory), and the guard that unmounts the views a
/// killed gateway leaves there before the directory goes.
fn scratch() -> (tempfile::TempDir, std::path::PathBuf, Unmounts) {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    let mut mounts = Unmounts::default();
    mounts.watch(&store);
    (work, store, mounts)
}

fn roots(d: &Path, names: &[&str]) {
    for n in names {
        std::fs::create_dir_all(d.join(n)).unwrap();
    }
}

/// Run `argv` (cwd the tenant root) and return (stdout, exit code).
async fn run(c: &mut Client, id: &str, cwd: &str, argv: &[&str]) -> (String, i64) {
    c.call(
        "process/start",
        json!({"processId": id, "argv": argv, "cwd": cwd, "env": {"PATH": "/bin:/usr/bin"}, "tty": false}),
    )
    .await;
    let out = c.collect(id).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        out.exit_code.unwrap_or(-1),
    )
}

#[tokio::test]
async fn tenants_on_two_images_see_their_own_root_and_write_only_their_workspace() {
    let Some(reg) = registry() else { return };
    let work = tempfile::tempdir().unwrap();
    // The store outside the gateway's directory: the views its SIGKILL
    // leaves mounted are unmounted before the store is removed.
    let store = work.path().join("store");
    let mut mounts = Unmounts::default();
    mounts.watch(&store);
    reg.push(
        &oci::busybox_layout(work.path(), "alpha"),
        "v1",
        "team/alpha",
    );
    reg.push(&oci::busybox_layout(work.path(), "beta"), "v1", "team/beta");
    let (ra, rb) = (
        reg.reference("team/alpha", "v1"),
        reg.reference("team/beta", "v1"),
    );
    let r = reg.addr.clone();
    let gw = Gateway::start_with(|d| {
        roots(d, &["a", "b", "c"]);
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{s}\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n\
             [tenants.a]\nroot = \"{d}/a\"\nimage = \"{ra}\"\n\
             [tenants.b]\nroot = \"{d}/b\"\nimage = \"{rb}\"\n\
             [tenants.c]\nroot = \"{d}/c\"\n",
            d = d.display(),
            s = store.display()
        )
    });
    let d = gw.dir.path().to_path_buf();
    for (t, marker) in [("a", "alpha"), ("b", "beta")] {
        let (mut c, _) = gw.session_of(t).await;
        let root = d.join(t).display().to_string();
        let (out, code) = run(&mut c, "m", &root, &["/bin/cat", "/usr/share/marker"]).await;
        assert_eq!((out.as_str(), code), (marker, 0), "tenant {t}");
        // The image is read-only; the workspace is the tenant's.
        let (out, code) = run(&mut c, "w", &root, &["/bin/touch", "/usr/share/x"]).await;
        assert_ne!(code, 0, "tenant {t} wrote into its image: {out}");
        let (out, code) = run(
            &mut c,
            "ok",
            &root,
            &["/bin/touch", &format!("{root}/made")],
        )
        .await;
        assert_eq!(code, 0, "{out}");
        assert!(d.join(t).join("made").exists());
        // The file API reads the image and writes the workspace.
        let r = c
            .call("fs/readFile", json!({"path": "/usr/share/marker"}))
            .await;
        assert_eq!(
            common::unb64(r["dataBase64"].as_str().unwrap()),
            marker.as_bytes()
        );
        let info = c.call("environment/info", json!({})).await;
        assert!(
            info["image"]["digest"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"),
            "{info}"
        );
    }
    // Without an image: the host's userland, as before.
    let (mut c, _) = gw.session_of("c").await;
    let root = d.join("c").display().to_string();
    let (_, code) = run(&mut c, "m", &root, &["/bin/cat", "/usr/share/marker"]).await;
    assert_ne!(code, 0);
    let info = c.call("environment/info", json!({})).await;
    assert!(info.get("image").is_none(), "{info}");
}

// === Hostile images, bounds, integrity, the store across restarts, GC ===

/// A config: an HS256 key, `server` (a `[server]` table or nothing),
/// `[images]` with `images`, and each tenant rooted at `DIR/NAME` with its
/// image (`None`: the host's userland).
fn config(d: &Path, server: &str, images: &str, tenants: &[(&str, Option<String>)]) -> String {
    // A tenant's first pull and unpack happen inside its first handshake:
    // in the emulated VM lane they take longer than the default 10 s.
    let server = if server.is_empty() {
        "[server]\n".to_owned()
    } else {
        server.to_owned()
    };
    let mut s = format!(
        "{server}handshake_timeout = \"{}s\"\n\
         [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
         [images]\n{images}\n",
        common::event_timeout().as_secs().max(10),
        d.display()
    );
    for (t, image) in tenants {
        let root = d.join(t);
        std::fs::create_dir_all(&root).unwrap();
        s.push_str(&format!("[tenants.{t}]\nroot = \"{}\"\n", root.display()));
        if let Some(i) = image {
            s.push_str(&format!("image = \"{i}\"\n"));
        }
    }
    s
}

/// `[images]` lines: the store at `store`, pulling from `reg` (plain HTTP).
fn images_from(store: &Path, reg: &str, bounds: &str) -> String {
    format!(
        "store = \"{}\"\nregistries = [\"{reg}\"]\ninsecure_registries = [\"{reg}\"]\n{bounds}",
        store.display()
    )
}

/// Tenant `t` serves its image: `/usr/share/marker` read by a process
/// (`cat`, when the image has busybox) or by the file API is `marker`.
async fn serves(gw: &Gateway, t: &str, marker: &str, busybox: bool) -> Client {
    let (status, body) = gw
        .handshake_pulled("/", Some(&format!("Bearer {}", gw.token(t))))
        .await;
    assert_eq!(
        status,
        101,
        "tenant {t}: {body} (logged: {:?})",
        oci::image_error(gw, t)
    );
    let (mut c, _) = gw.session_of(t).await;
    if busybox {
        let root = gw.dir.path().join(t).display().to_string();
        let (out, code) = run(&mut c, "marker", &root, &["/bin/cat", "/usr/share/marker"]).await;
        assert_eq!((out.as_str(), code), (marker, 0), "tenant {t}");
    } else {
        let r = c
            .call("fs/readFile", json!({"path": "/usr/share/marker"}))
            .await;
        let got = common::unb64(r["dataBase64"].as_str().unwrap());
        assert_eq!(got, marker.as_bytes(), "tenant {t}");
    }
    c
}

/// The host's userland tenant `t` still runs processes.
async fn host_tenant_serves(gw: &Gateway, t: &str) {
    let (mut c, _) = gw.session_of(t).await;
    let root = gw.dir.path().join(t).display().to_string();
    let (out, code) = run(&mut c, "still", &root, &["/bin/echo", "still"]).await;
    assert_eq!((out.as_str(), code), ("still\n", 0), "tenant {t}");
}

/// Tenant `t`'s image is refused: its client's handshake fails, the body
/// holding `told`; the gateway's log says `why`; the store is as it was
/// (no layer, no image record, no reference, nothing left in `tmp/`).
async fn refused(gw: &Gateway, store: &Path, t: &str, told: &str, why: &str) {
    let before = StoreState::of(store);
    let (status, body) = gw
        .handshake_pulled("/", Some(&format!("Bearer {}", gw.token(t))))
        .await;
    assert!(
        (400..600).contains(&status),
        "tenant {t}: status {status}: {body}"
    );
    assert!(
        body.contains(told),
        "tenant {t}: the client was told {body:?}, not {told:?}"
    );
    let logged = oci::image_error(gw, t)
        .unwrap_or_else(|| panic!("tenant {t}: no `image unavailable` in the log"));
    assert!(
        logged.contains(why),
        "tenant {t}: the log says {logged:?}, not {why:?}"
    );
    let after = StoreState::of(store);
    assert_eq!(
        after, before,
        "tenant {t}'s refused image changed the store"
    );
    assert!(after.tmp.is_empty(), "left in tmp/: {:?}", after.tmp);
}

/// A small layer of its own (a first layer below a hostile one: it is
/// unpacked and committed, and must go when the image is refused).
fn own_layer(name: &str) -> Layer {
    Layer::gzip(&layer(&[
        Entry::Dir("srv", 0o755),
        Entry::File(
            Box::leak(format!("srv/{name}").into_boxed_str()),
            0o644,
            name.as_bytes().to_vec(),
        ),
    ]))
}

/// `n` bytes gzip cannot shrink.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Guards: an entry that would write outside the layer's directory (`..`,
/// an absolute path, a path through a symbolic link planted earlier in the
/// layer, a hard link to a host file) or make a device node or a FIFO
/// refuses the image, with the reason told to the client (a registry
/// image) and logged; nothing is written outside, the layer below it that
/// was already committed is removed, and the gateway serves on.
#[tokio::test]
async fn hostile_layer_entries_are_refused_and_the_store_is_untouched() {
    let Some(reg) = registry() else { return };
    let (work, store, _mounts) = scratch();
    let outside = work.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("target"), b"host file").unwrap();
    let o = outside.display().to_string();
    let (abs, target) = (format!("{o}/abs"), format!("{o}/target"));
    let file = |n: &'static str| Entry::File(n, 0o644, b"x".to_vec());
    let raw = |k, n| Entry::Raw(k, n, "", Vec::new());
    use tar::EntryType as T;
    let cases: Vec<(&str, Vec<Entry<'_>>, &str)> = vec![
        (
            "dotdot",
            vec![
                file("fine"),
                Entry::Raw(T::Regular, "../../../../outside/dotdot", "", b"x".to_vec()),
            ],
            "a `..` component",
        ),
        (
            "absolute",
            vec![
                file("fine"),
                Entry::Raw(T::Regular, &abs, "", b"x".to_vec()),
            ],
            "an absolute path",
        ),
        (
            "symlink",
            vec![Entry::Symlink("out", &o), file("out/planted")],
            "a path through a symbolic link",
        ),
        (
            "hardlink",
            vec![file("fine"), Entry::Hardlink("h", &target)],
            "an absolute path",
        ),
        (
            "hardup",
            vec![Entry::Hardlink("h", "../../../../outside/target")],
            "a `..` component",
        ),
        (
            "hardsym",
            vec![
                Entry::Symlink("out", &o),
                Entry::Hardlink("h", "out/target"),
            ],
            "a path through a symbolic link",
        ),
        ("block", vec![raw(T::Block, "dev/sda")], "of type Block"),
        ("char", vec![raw(T::Char, "dev/mem")], "of type Char"),
        (
            "fifo",
            vec![file("fine"), raw(T::Fifo, "run/fifo")],
            "of type Fifo",
        ),
    ];
    reg.push(&oci::busybox_layout(work.path(), "good"), "v1", "team/good");
    let mut tenants = vec![
        ("good", Some(reg.reference("team/good", "v1"))),
        ("host", None),
    ];
    for (name, entries, _) in &cases {
        let dir = work.path().join(format!("layout-{name}"));
        oci::write_layout(
            &dir,
            "v1",
            &[own_layer(name), Layer::gzip(&layer(entries))],
            &[],
        );
        reg.push(&dir, "v1", &format!("team/{name}"));
        tenants.push((name, Some(reg.reference(&format!("team/{name}"), "v1"))));
    }
    let images = images_from(&store, &reg.addr, "");
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    drop(serves(&gw, "good", "good", true).await);
    for (name, _, why) in &cases {
        refused(&gw, &store, name, why, why).await;
    }
    // Nothing was written or linked outside.
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("target")]);
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(outside.join("target")).unwrap().nlink(),
        1
    );
    assert_eq!(std::fs::read(outside.join("target")).unwrap(), b"host file");
    // The store has the good image only, and serves it still.
    assert_eq!(StoreState::of(&store).layer_dirs().len(), 1);
    drop(serves(&gw, "good", "good", true).await);
    host_tenant_serves(&gw, "host").await;
}

/// Guards: the bounds of `[images]`: a gzip layer that inflates past
/// `max_image_bytes` (alone, or with the layer below it), a layer larger
/// than `max_layer_bytes` as sent, more entries than `max_entries`: each
/// refuses the image before it fills the disk; the store is untouched.
#[tokio::test]
async fn bombs_and_oversized_layers_are_refused_at_their_bounds() {
    let Some(reg) = registry() else { return };
    let (work, store, _mounts) = scratch();
    let zeros =
        |name: &'static str, n: usize| Layer::gzip(&layer(&[Entry::File(name, 0o644, vec![0; n])]));
    let many: Vec<Entry<'_>> = (0..100)
        .map(|i| {
            Entry::File(
                Box::leak(format!("f{i}").into_boxed_str()),
                0o644,
                Vec::new(),
            )
        })
        .collect();
    let cases: Vec<(&str, Vec<Layer>, &str)> = vec![
        // 32 MiB of zeros: some 32 KiB sent.
        (
            "bomb",
            vec![own_layer("bomb"), zeros("big", 32 << 20)],
            "bytes uncompressed",
        ),
        // Each layer under the bound, the image over it.
        (
            "split",
            vec![zeros("a", 3 << 20), zeros("b", 3 << 20)],
            "bytes uncompressed",
        ),
        (
            "large",
            vec![Layer::gzip(&layer(&[Entry::File(
                "noise",
                0o644,
                noise(2 << 20),
            )]))],
            "more than images.max_layer_bytes",
        ),
        (
            "entries",
            vec![own_layer("entries"), Layer::gzip(&layer(&many))],
            "more than 62 entries",
        ),
    ];
    reg.push(&oci::busybox_layout(work.path(), "good"), "v1", "team/good");
    let mut tenants = vec![("good", Some(reg.reference("team/good", "v1")))];
    for (name, layers, _) in &cases {
        let dir = work.path().join(format!("layout-{name}"));
        oci::write_layout(&dir, "v1", layers, &[]);
        reg.push(&dir, "v1", &format!("team/{name}"));
        tenants.push((name, Some(reg.reference(&format!("team/{name}"), "v1"))));
    }
    // busybox: 1.9 MB, 22 entries, 1.1 MB as sent.
    let images = images_from(
        &store,
        &reg.addr,
        "max_image_bytes = 4194304\nmax_layer_bytes = 1572864\nmax_entries = 64\n",
    );
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    drop(serves(&gw, "good", "good", true).await);
    for (name, _, why) in &cases {
        refused(&gw, &store, name, why, why).await;
    }
    assert_eq!(StoreState::of(&store).layer_dirs().len(), 1);
    drop(serves(&gw, "good", "good", true).await);
}

/// Guards: what a layout holds is checked, not trusted: a blob whose bytes
/// are not its digest (a layer, a config), a layer that is not the diff_id
/// its config names, a layer compressed in a way not unpacked here (zstd),
/// an image for another architecture: each refused (a layout's client is
/// told only that the image could not be had; the log says why), the
/// store untouched, and the gateway serving on.
#[tokio::test]
async fn layouts_that_lie_about_their_content_are_refused() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let (work, store, _mounts) = scratch();
    let small = |n: &str| {
        layer(&[Entry::File(
            Box::leak(n.to_owned().into_boxed_str()),
            0o644,
            n.as_bytes().to_vec(),
        )])
    };
    let layout = |name: &str, layers: &[Layer]| {
        let dir = work.path().join(format!("layout-{name}"));
        oci::write_layout(&dir, "v1", layers, &[]);
        dir
    };
    // A layer blob changed after it was written.
    let tampered = layout(
        "tampered",
        &[own_layer("tampered"), Layer::gzip(&small("x"))],
    );
    oci::tamper(&oci::blob_path(&tampered, &Layer::gzip(&small("x")).blob));
    // The config changed after it was written.
    let config_lie = layout("config", &[Layer::gzip(&small("config"))]);
    oci::tamper(&oci::config_blob(&config_lie, "v1"));
    // The config names another diff_id than the layer's.
    let mut lying = Layer::gzip(&small("diffid"));
    lying.diff_id = format!("sha256:{}", oci::sha256_hex(b"another layer"));
    let diffid = layout("diffid", &[own_layer("diffid"), lying]);
    // zstd.
    let mut zstd = Layer::plain(&small("zstd"));
    zstd.media_type = "application/vnd.oci.image.layer.v1.tar+zstd";
    let zstd = layout("zstd", &[zstd]);
    // Another architecture.
    let foreign_arch = if oci::host_arch() == "s390x" {
        "ppc64le"
    } else {
        "s390x"
    };
    let arch = layout("arch", &[Layer::gzip(&small("arch"))]);
    oci::edit_config(&arch, "v1", |c| c["architecture"] = foreign_arch.into());
    let good = oci::busybox_layout(work.path(), "good");
    let oci_ref = |p: &Path| format!("oci:{}:v1", p.display());
    let tenants = vec![
        ("good", Some(oci_ref(&good))),
        ("tampered", Some(oci_ref(&tampered))),
        ("config", Some(oci_ref(&config_lie))),
        ("diffid", Some(oci_ref(&diffid))),
        ("zstd", Some(oci_ref(&zstd))),
        ("arch", Some(oci_ref(&arch))),
    ];
    let images = format!("store = \"{}\"\n", store.display());
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    drop(serves(&gw, "good", "good", true).await);
    let told = "could not be had";
    refused(&gw, &store, "tampered", told, "does not match its digest").await;
    refused(&gw, &store, "config", told, "does not match its digest").await;
    refused(&gw, &store, "diffid", told, "is not the diff_id").await;
    refused(&gw, &store, "zstd", told, "tar+zstd\" is not unpacked here").await;
    refused(
        &gw,
        &store,
        "arch",
        told,
        &format!("an image for linux/{foreign_arch}"),
    )
    .await;
    assert_eq!(StoreState::of(&store).layer_dirs().len(), 1);
    drop(serves(&gw, "good", "good", true).await);
}

/// Guards: what a tenant sees of its image's files: setuid and setgid bits
/// dropped (files and directories), an upper layer's `.wh.NAME` hiding
/// NAME of the layer below, and `.wh..wh..opq` hiding all the directory
/// held below (the upper layer's own entries there stay).
#[tokio::test]
async fn setuid_bits_go_and_whiteouts_hide_what_is_below() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let (work, store, _mounts) = scratch();
    let lower = layer(&[
        Entry::Dir("usr", 0o755),
        Entry::Dir("usr/bin", 0o755),
        Entry::File("usr/bin/suid", 0o4755, b"#!/bin/sh\n".to_vec()),
        Entry::File("usr/bin/sgid", 0o2755, b"#!/bin/sh\n".to_vec()),
        Entry::Dir("srv", 0o755),
        Entry::Dir("srv/shared", 0o2775),
        Entry::Dir("usr/share", 0o755),
        Entry::File("usr/share/gone", 0o644, b"gone".to_vec()),
        Entry::File("usr/share/kept", 0o644, b"kept".to_vec()),
        Entry::Dir("opt", 0o755),
        Entry::Dir("opt/d", 0o755),
        Entry::File("opt/d/a", 0o644, b"a".to_vec()),
        Entry::Dir("opt/d/sub", 0o755),
        Entry::File("opt/d/sub/b", 0o644, b"b".to_vec()),
    ]);
    let upper = layer(&[
        Entry::Dir("usr", 0o755),
        Entry::Dir("usr/share", 0o755),
        Entry::File("usr/share/.wh.gone", 0o644, Vec::new()),
        Entry::Dir("opt", 0o755),
        Entry::Dir("opt/d", 0o755),
        Entry::File("opt/d/.wh..wh..opq", 0o644, Vec::new()),
        Entry::File("opt/d/new", 0o644, b"new".to_vec()),
    ]);
    let dir = work.path().join("layout");
    oci::write_layout(
        &dir,
        "v1",
        &[
            Layer::gzip(&oci::busybox_layer("semantics")),
            Layer::gzip(&lower),
            Layer::plain(&upper),
        ],
        &["PATH=/bin"],
    );
    let images = format!("store = \"{}\"\n", store.display());
    let tenants = [("t", Some(format!("oci:{}:v1", dir.display())))];
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let mut c = serves(&gw, "t", "semantics", true).await;
    let root = gw.dir.path().join("t").display().to_string();
    for (path, mode) in [
        ("/usr/bin/suid", "755"),
        ("/usr/bin/sgid", "755"),
        ("/srv/shared", "775"),
    ] {
        let (out, code) = run(&mut c, path, &root, &["/bin/stat", "-c", "%a", path]).await;
        assert_eq!((out.trim(), code), (mode, 0), "{path}");
    }
    let (out, code) = run(&mut c, "gone", &root, &["/bin/cat", "/usr/share/gone"]).await;
    assert_ne!(code, 0, "a whiteout left it: {out}");
    let (out, code) = run(&mut c, "kept", &root, &["/bin/cat", "/usr/share/kept"]).await;
    assert_eq!((out.as_str(), code), ("kept", 0));
    let (out, code) = run(&mut c, "opaque", &root, &["/bin/ls", "-A", "/opt/d"]).await;
    assert_eq!((out.as_str(), code), ("new\n", 0), "an opaque directory");
    // The file API sees the same.
    let (_, message) = c
        .call_err("fs/readFile", json!({"path": "/usr/share/gone"}))
        .await;
    assert!(!message.is_empty());
}

/// Views of `store` mounted now.
fn views_mounted(store: &Path) -> usize {
    oci::mounts_under(&store.join("views")).len()
}

/// Leave in `store` what a gateway dying mid-pull would: work in `tmp/`,
/// a layer directory renamed in but never recorded, a record written
/// half-way, an image record naming a layer the store lacks and a
/// reference to an image it does not have.
fn plant_leftovers(store: &Path, n: u32) {
    let hex = |c: char, len: usize| std::iter::repeat_n(c, len).collect::<String>();
    std::fs::create_dir_all(store.join(format!("tmp/pull{n}/layer/usr"))).unwrap();
    std::fs::write(store.join(format!("tmp/pull{n}/layer/usr/x")), b"x").unwrap();
    std::fs::create_dir_all(store.join(format!("layers/{}{n}/usr", hex('e', 31)))).unwrap();
    std::fs::write(
        store.join(format!("layers/{}{n}.json.new", hex('e', 31))),
        b"{",
    )
    .unwrap();
    let missing = hex('f', 32);
    let digest = format!("sha256:{}{n}", hex('d', 63));
    std::fs::write(
        store.join(format!("images/{}{n}.json", hex('d', 63))),
        json!({"digest": digest, "source": "planted", "layers": [missing],
               "env": [], "working_dir": null, "bytes": 1})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        store.join(format!("refs/{}{n}.json", hex('c', 31))),
        json!({"source": "planted", "digest": digest}).to_string(),
    )
    .unwrap();
}

/// Guards: the store outlives its gateway. A gateway stopped (SIGTERM) or
/// killed (SIGKILL, a session live, its view left mounted) is followed by
/// one on the same store that uses the image it holds without pulling it
/// (its registry is gone by then), with what a death mid-pull leaves
/// (`tmp/`, uncommitted layers, dangling records) removed and the views
/// left mounted unmounted.
#[tokio::test]
async fn the_store_survives_a_restart_and_a_kill_without_pulling_again() {
    let Some(reg) = registry() else { return };
    let (work, store, _mounts) = scratch();
    reg.push(&oci::busybox_layout(work.path(), "kept"), "v1", "team/kept");
    let tenants = [
        ("a", Some(reg.reference("team/kept", "v1"))),
        ("host", None),
    ];
    let images = images_from(&store, &reg.addr, "");
    let start = || oci::start_logged(|d| config(d, "", &images, &tenants));
    let mut first = start();
    drop(serves(&first, "a", "kept", true).await);
    assert_eq!(oci::logged(&first, "image pulled"), 1);
    let pulled = StoreState::of(&store);
    assert_eq!(pulled.layer_dirs().len(), 1, "{pulled:?}");
    assert_eq!(pulled.images.len(), 1, "{pulled:?}");
    first.signal(15);
    first.wait_exit();
    // The registry is gone: an image used from now on is the store's.
    drop(reg);
    plant_leftovers(&store, 1);

    let second = start();
    let live = serves(&second, "a", "kept", true).await;
    assert_eq!(oci::logged(&second, "image pulled"), 0);
    assert_eq!(
        StoreState::of(&store),
        pulled,
        "leftovers of a death mid-pull"
    );
    // Whether this process sees the gateways' mounts: here it does; in
    // the VM lane it did not (the view served, yet none was listed), and
    // the mount counts below are then not checked.
    let visible = views_mounted(&store) > 0;
    if !visible {
        eprintln!("views not visible to the test process: mount counts not checked");
    }
    assert!(
        !visible || views_mounted(&store) == 1,
        "the first gateway's view is unmounted"
    );
    host_tenant_serves(&second, "host").await;
    // Killed with a session live and its view mounted.
    plant_leftovers(&store, 2);
    drop(second);
    drop(live);
    // Left mounted by the kill on the host; in the VM lane it was found
    // gone once (unexplained): the restart's own check below holds either way.
    assert!(views_mounted(&store) <= 1);

    let third = start();
    drop(serves(&third, "a", "kept", true).await);
    assert_eq!(oci::logged(&third, "image pulled"), 0);
    assert_eq!(StoreState::of(&store), pulled, "leftovers of a kill");
    assert!(
        !visible || views_mounted(&store) == 1,
        "the killed gateway's view is unmounted"
    );
}

/// Waits until the store's image from `source` has no live view (`/readyz`
/// lists each image with how many views use it).
async fn unused(gw: &Gateway, source: &str) {
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let (_, body) = gw.admin_get("/readyz").await;
        if body
            .lines()
            .any(|l| l.contains(source) && l.ends_with(", 0 in use)"))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{source} still in use: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Guards the store's bound and its garbage collection: with room for one
/// image, an image a live tenant uses is never evicted (another tenant's
/// pull fails with "store is full", the store untouched), and once that
/// tenant is retired (idle) its image is evicted to make room, whatever
/// the next image's layers compress to (a few KiB sent, 2 MiB unpacked).
#[tokio::test]
async fn a_full_store_evicts_only_images_no_tenant_uses() {
    let Some(reg) = registry() else { return };
    let (work, store, _mounts) = scratch();
    reg.push(
        &oci::busybox_layout(work.path(), "alpha"),
        "v1",
        "team/alpha",
    );
    let zeros = work.path().join("layout-zeros");
    oci::write_layout(
        &zeros,
        "v1",
        &[Layer::gzip(&layer(&[
            Entry::Dir("usr", 0o755),
            Entry::Dir("usr/share", 0o755),
            Entry::File("usr/share/marker", 0o644, b"beta".to_vec()),
            Entry::File("zeros", 0o644, vec![0; 2 << 20]),
        ]))],
        &[],
    );
    reg.push(&zeros, "v1", "team/beta");
    let (alpha, beta) = (
        reg.reference("team/alpha", "v1"),
        reg.reference("team/beta", "v1"),
    );
    let tenants = [
        ("a", Some(alpha.clone())),
        ("b", Some(beta.clone())),
        ("host", None),
    ];
    // 3 MiB: busybox (1.9 MB) or the zeros (2 MiB), not both.
    let images = images_from(
        &store,
        &reg.addr,
        "max_store_bytes = 3145728\nmax_image_bytes = 3145728\n",
    );
    let gw = oci::start_logged(|d| {
        config(
            d,
            "[server]\ntenant_idle_timeout = \"1s\"\n",
            &images,
            &tenants,
        )
    });
    let a = serves(&gw, "a", "alpha", true).await;
    refused(&gw, &store, "b", "store is full", "store is full").await;
    host_tenant_serves(&gw, "host").await;
    // Still a's.
    drop(serves(&gw, "a", "alpha", true).await);
    let with_alpha = StoreState::of(&store);
    // a's session ends; a retires when idle, and its view goes.
    drop(a);
    unused(&gw, &alpha).await;
    drop(serves(&gw, "b", "beta", false).await);
    let with_beta = StoreState::of(&store);
    assert_eq!(with_beta.layer_dirs().len(), 1, "{with_beta:?}");
    assert!(
        with_alpha
            .layer_dirs()
            .iter()
            .all(|l| !with_beta.layer_dirs().contains(l)),
        "alpha's layer evicted: {with_alpha:?} {with_beta:?}"
    );
    assert_eq!(with_beta.images.len(), 1, "{with_beta:?}");
    assert!(with_beta.tmp.is_empty());
    let (_, ready) = gw.admin_get("/readyz").await;
    assert!(!ready.contains(&alpha), "{ready}");
}

/// Guards the store's accounting of an `oci-archive`: the layout unpacked
/// from it is work in `tmp/`, not the store's bytes for good: once the
/// image is in, the store has room for what its layers leave.
#[tokio::test]
async fn an_archive_is_charged_to_the_store_only_while_it_is_read() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let (work, store, _mounts) = scratch();
    let file = work.path().join("busybox.tar");
    oci::archive(&oci::busybox_layout(work.path(), "archived"), &file);
    // 768 KiB that do not compress: 1.9 MB + 0.8 MB fit 3 MiB; with the
    // archive's 1.1 MB still charged they would not.
    let small = work.path().join("layout-small");
    oci::write_layout(
        &small,
        "v1",
        &[Layer::gzip(&layer(&[
            Entry::Dir("usr", 0o755),
            Entry::Dir("usr/share", 0o755),
            Entry::File("usr/share/marker", 0o644, b"small".to_vec()),
            Entry::File("noise", 0o644, noise(768 << 10)),
        ]))],
        &[],
    );
    let tenants = [
        ("x", Some(format!("oci-archive:{}:v1", file.display()))),
        ("y", Some(format!("oci:{}:v1", small.display()))),
    ];
    let images = format!(
        "store = \"{}\"\nmax_store_bytes = 3145728\nmax_image_bytes = 3145728\n",
        store.display()
    );
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let _x = serves(&gw, "x", "archived", true).await;
    drop(serves(&gw, "y", "small", false).await);
    let s = StoreState::of(&store);
    assert_eq!(s.layer_dirs().len(), 2, "{s:?}");
    assert!(s.tmp.is_empty(), "{s:?}");
}

/// Guards layer sharing: two images on one base layer, one from a
/// registry and one from a layout, activated at once: the base is
/// unpacked once (one directory under `layers/`), each tenant sees its own
/// top layer over it.
#[tokio::test]
async fn images_sharing_a_base_layer_unpack_it_once() {
    let Some(reg) = registry() else { return };
    let (work, store, _mounts) = scratch();
    let base = oci::busybox_layer("base");
    let top = |m: &str| {
        Layer::gzip(&layer(&[
            Entry::Dir("usr", 0o755),
            Entry::Dir("usr/share", 0o755),
            Entry::File("usr/share/marker", 0o644, m.as_bytes().to_vec()),
        ]))
    };
    let (x, y) = (work.path().join("layout-x"), work.path().join("layout-y"));
    oci::write_layout(&x, "v1", &[Layer::gzip(&base), top("x")], &["PATH=/bin"]);
    oci::write_layout(&y, "v1", &[Layer::gzip(&base), top("y")], &["PATH=/bin"]);
    reg.push(&x, "v1", "team/x");
    let tenants = [
        ("x", Some(reg.reference("team/x", "v1"))),
        ("y", Some(format!("oci:{}:v1", y.display()))),
    ];
    let images = images_from(&store, &reg.addr, "");
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let (cx, cy) = tokio::join!(serves(&gw, "x", "x", true), serves(&gw, "y", "y", true));
    drop((cx, cy));
    let s = StoreState::of(&store);
    let key = &oci::sha256_hex(&base)[..32];
    assert_eq!(s.layer_dirs().len(), 3, "base, x's top, y's top: {s:?}");
    assert!(s.layer_dirs().contains(&key), "{s:?}");
    assert_eq!(s.images.len(), 2, "{s:?}");
}

// === What the attack review found: a lying registry, borrowed layers, free entries ===

/// A registry that lies, on a loopback port of its own: `route` answers
/// each request's path with a whole HTTP response (status line, headers,
/// body), or `None` to stream `A`s until the client goes away. Counts the
/// requests it gets.
struct Liar {
    addr: String,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Liar {
    fn start(route: impl Fn(&str, &str) -> Option<String> + Send + Sync + 'static) -> Liar {
        use std::io::Write as _;
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let me = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
        let (h, m) = (hits.clone(), me.clone());
        let addr = oci::serve_http(move |path, s| {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match route(m.get().map_or("", String::as_str), path) {
                Some(r) => {
                    let _ = s.write_all(r.as_bytes());
                }
                None => {
                    let _ = s.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"token\":\"",
                    );
                    let chunk = vec![b'A'; 64 << 10];
                    // Far past any bound; stops when the client does.
                    for _ in 0..1024 {
                        if s.write_all(&chunk).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let _ = me.set(addr.clone());
        Liar { addr, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn http(status: &str, headers: &str) -> Option<String> {
    Some(format!(
        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n{headers}\r\n"
    ))
}

/// Guards (the attack review's highs and SSRF): a token reply is read to
/// its bound, not to the end of the registry's patience (or the host's
/// memory); a token service on a host `[images] registries` does not list
/// is never asked; a manifest's redirect is not followed. Each refusal
/// reaches the client, and the other host gets no request at all.
#[tokio::test]
async fn a_lying_registry_gets_bounded_reads_and_no_hop_elsewhere() {
    // Another host: whatever reaches it is a hop the gateway should not
    // have made.
    let elsewhere = Liar::start(|_, _| http("200 OK", ""));
    let other = elsewhere.addr.clone();
    let endless = Liar::start(|me, path| match path {
        p if p.starts_with("/token") => None,
        _ => http(
            "401 Unauthorized",
            &format!("www-authenticate: Bearer realm=\"http://{me}/token\",service=\"x\"\r\n"),
        ),
    });
    let o = other.clone();
    let foreign = Liar::start(move |_, _| {
        http(
            "401 Unauthorized",
            &format!("www-authenticate: Bearer realm=\"http://{o}/token\",service=\"x\"\r\n"),
        )
    });
    let o = other.clone();
    let redirect = Liar::start(move |_, path| match path {
        "/v2/" => http("200 OK", ""),
        _ => http("302 Found", &format!("location: http://{o}/leak\r\n")),
    });
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    let regs: Vec<&str> = vec![&endless.addr, &foreign.addr, &redirect.addr];
    let list = regs
        .iter()
        .map(|r| format!("\"{r}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let images = format!(
        "store = \"{}\"\nregistries = [{list}]\ninsecure_registries = [{list}]\n",
        store.display()
    );
    let tenants = vec![
        ("endless", Some(format!("{}/r:1", endless.addr))),
        ("foreign", Some(format!("{}/r:1", foreign.addr))),
        ("redirect", Some(format!("{}/r:1", redirect.addr))),
        ("host", None),
    ];
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    refused(
        &gw,
        &store,
        "endless",
        "token reply: larger than 65536 bytes",
        "token reply",
    )
    .await;
    refused(
        &gw,
        &store,
        "foreign",
        "the token service is not the registry",
        "token service",
    )
    .await;
    refused(&gw, &store, "redirect", "the registry answered 302", "302").await;
    assert_eq!(
        elsewhere.hits(),
        0,
        "the gateway went to a host it was not given"
    );
    host_tenant_serves(&gw, "host").await;
}

/// Guards (the attack review's layer borrowing): an image whose config
/// names another image's layer (by its diff_id, or by one sharing its
/// first 128 bits) but whose own blob is something else does not get that
/// layer: it is refused, and the owner's private file never shows in it.
#[tokio::test]
async fn a_layer_is_shared_only_with_an_image_that_has_it() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let (work, store, _mounts) = scratch();
    let private = layer(&[
        Entry::Dir("srv", 0o755),
        Entry::File("srv/private", 0o644, b"SECRET".to_vec()),
    ]);
    let owner = work.path().join("layout-owner");
    oci::write_layout(
        &owner,
        "v1",
        &[
            Layer::gzip(&oci::busybox_layer("owner")),
            Layer::gzip(&private),
        ],
        &["PATH=/bin"],
    );
    let private_id = format!("sha256:{}", oci::sha256_hex(&private));
    let junk = layer(&[Entry::File("junk", 0o644, b"junk".to_vec())]);
    let borrow = |name: &str, diff_id: String| {
        let mut l = Layer::gzip(&junk);
        l.diff_id = diff_id;
        let dir = work.path().join(format!("layout-{name}"));
        oci::write_layout(
            &dir,
            "v1",
            &[Layer::gzip(&oci::busybox_layer(name)), l],
            &["PATH=/bin"],
        );
        dir
    };
    let exact = borrow("exact", private_id.clone());
    // The same first 128 bits (the store's key), another diff_id.
    let mut near = private_id.clone();
    let last = near.pop().unwrap();
    near.push(if last == '0' { '1' } else { '0' });
    let near = borrow("near", near);
    let oci_ref = |p: &Path| format!("oci:{}:v1", p.display());
    let tenants = vec![
        ("owner", Some(oci_ref(&owner))),
        ("exact", Some(oci_ref(&exact))),
        ("near", Some(oci_ref(&near))),
    ];
    let images = format!("store = \"{}\"\n", store.display());
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let mut c = serves(&gw, "owner", "owner", true).await;
    let root = gw.dir.path().join("owner").display().to_string();
    assert_eq!(
        run(&mut c, "p", &root, &["/bin/cat", "/srv/private"])
            .await
            .0,
        "SECRET"
    );
    let told = "could not be had";
    refused(&gw, &store, "exact", told, "is not the diff_id").await;
    refused(&gw, &store, "near", told, "name another layer").await;
}

/// Guards (the attack review's free entries): the store charges every
/// entry, not only file bytes: an image of empty directories is refused
/// once they would take more than `max_store_bytes`.
#[tokio::test]
async fn empty_directories_are_charged_to_the_store() {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    let names: Vec<String> = (0..2000).map(|i| format!("d{i}")).collect();
    let entries: Vec<Entry<'_>> = names.iter().map(|n| Entry::Dir(n, 0o755)).collect();
    let dirs = work.path().join("layout-dirs");
    oci::write_layout(&dirs, "v1", &[Layer::gzip(&layer(&entries))], &[]);
    let tenants = vec![
        ("dirs", Some(format!("oci:{}:v1", dirs.display()))),
        ("host", None),
    ];
    // 2,000 directories at a block each: 8 MB, past 4 MiB.
    let images = format!(
        "store = \"{}\"\nmax_store_bytes = 4194304\nmax_image_bytes = 4194304\n",
        store.display()
    );
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    refused(&gw, &store, "dirs", "could not be had", "store is full").await;
    host_tenant_serves(&gw, "host").await;
}

// === The pull rate floor (issue #43): a registry that drips ===

/// A registry that drips, on a loopback port of its own: it serves the
/// image whose manifest is `manifest` in the layout at `layout` under any
/// repository and tag, every blob whole but `slow`, which it sends a byte
/// every 250 ms (4 bytes/s) for as long as the client reads.
struct Drip {
    addr: String,
    /// Set once the slow blob has begun to drip.
    dripping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drip {
    fn start(layout: &Path, manifest: &str, slow: &str) -> Drip {
        use std::io::Write as _;
        let (blobs, manifest, slow) = (
            layout.join("blobs/sha256"),
            manifest.to_owned(),
            slow.to_owned(),
        );
        let dripping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = dripping.clone();
        let addr = oci::serve_http(move |path, s| {
            let Some((digest, body, kind)) = oci::layout_object(&blobs, &manifest, path) else {
                let _ = s.write_all(oci::NOT_FOUND);
                return;
            };
            if s.write_all(oci::ok_head(kind, body.len()).as_bytes())
                .is_err()
            {
                return;
            }
            if digest != slow {
                let _ = s.write_all(&body);
                return;
            }
            let _ = s.set_nodelay(true);
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            for byte in body {
                std::thread::sleep(std::time::Duration::from_millis(250));
                if s.write_all(&[byte]).is_err() {
                    return;
                }
            }
        });
        Drip { addr, dripping }
    }
}

/// [`Gateway::handshake`] as tenant `t`, waiting up to `wait` for the answer.
async fn handshake_within(gw: &Gateway, t: &str, wait: std::time::Duration) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(&gw.addr).await.unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {}\r\n\r\n",
        gw.token(t)
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(wait, s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("tenant {t}: no answer to the handshake within {wait:?}"))
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("tenant {t}: not an HTTP answer: {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// Guards the pull rate floor (`distribution::Pace`, untested before): a
/// registry that sends a layer at 4 bytes/s is cut off once the floor's
/// 20 s grace has passed, not left to hold the pull until `pull_timeout`
/// (10 minutes): the tenant is told the blob arrived too slowly and the
/// log says so, the store is as it was, and the pull slot is given back:
/// with `max_concurrent_pulls = 1`, another image's pull then succeeds
/// (were the slot still held, that pull would wait past its handshake).
/// Takes some 20 s: the grace is a constant, not configurable.
#[tokio::test]
async fn a_registry_that_drips_a_blob_is_cut_off_and_frees_its_pull_slot() {
    let (work, store, _mounts) = scratch();
    let marked = |m: &'static str| {
        layer(&[
            Entry::Dir("usr", 0o755),
            Entry::Dir("usr/share", 0o755),
            Entry::File("usr/share/marker", 0o644, m.as_bytes().to_vec()),
        ])
    };
    // Uncompressed: 10 KiB, some 40 minutes at 4 bytes/s.
    let slow_layer = Layer::plain(&marked("slow"));
    let slow_digest = format!("sha256:{}", oci::sha256_hex(&slow_layer.blob));
    let slow = work.path().join("layout-slow");
    let manifest = oci::write_layout(&slow, "v1", &[slow_layer], &[]);
    let drip = Drip::start(&slow, &manifest, &slow_digest);
    let after = work.path().join("layout-after");
    oci::write_layout(&after, "v1", &[Layer::gzip(&marked("after"))], &[]);
    let tenants = [
        ("slow", Some(format!("{}/team/slow:v1", drip.addr))),
        ("after", Some(format!("oci:{}:v1", after.display()))),
    ];
    let images = images_from(&store, &drip.addr, "max_concurrent_pulls = 1\n");
    // The slow pull happens inside the tenant's first handshake: both the
    // client and the gateway wait past the floor's 20 s grace.
    let wait = common::event_timeout() + std::time::Duration::from_secs(30);
    let gw = oci::start_logged(|d| {
        let server = format!(
            "[server]\nhandshake_timeout = \"{}s\"\n",
            wait.as_secs() + 10
        );
        let mut s = format!(
            "{server}[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
             [images]\n{images}\n",
            d.display()
        );
        for (t, image) in &tenants {
            let root = d.join(t);
            std::fs::create_dir_all(&root).unwrap();
            s.push_str(&format!("[tenants.{t}]\nroot = \"{}\"\n", root.display()));
            if let Some(i) = image {
                s.push_str(&format!("image = \"{i}\"\n"));
            }
        }
        s
    });
    let before = StoreState::of(&store);
    let (status, body) = handshake_within(&gw, "slow", wait).await;
    assert!(
        (400..600).contains(&status),
        "the dripping image was not refused: status {status}: {body}"
    );
    let told = format!("blob {slow_digest}: arriving slower than 64 KiB/s");
    assert!(
        body.contains(&told),
        "the client was told {body:?}, not {told:?}"
    );
    let logged = oci::image_error(&gw, "slow").expect("no `image unavailable` in the log");
    assert!(logged.contains(&told), "the log says {logged:?}");
    let now = StoreState::of(&store);
    assert_eq!(now, before, "the cut-off pull changed the store");
    assert!(now.tmp.is_empty(), "left in tmp/: {:?}", now.tmp);
    // The only pull slot is free again.
    drop(serves(&gw, "after", "after", false).await);
}

// === A tenant's share of the store ===

/// `initialize` asking for `image`: the whole response; a session opened
/// is `initialized`.
async fn initialize_on(c: &mut Client, image: &str) -> serde_json::Value {
    let r = c
        .call_raw("initialize", json!({"clientName": "x", "image": image}))
        .await;
    if r.get("result").is_some() {
        c.send(&json!({"method": "initialized"})).await;
    }
    r
}

/// What `/usr/share/marker` holds in `c`'s session (its image's name).
async fn marker_of(c: &mut Client, id: &str, root: &Path) -> String {
    let root = root.display().to_string();
    let (out, code) = run(c, id, &root, &["/bin/cat", "/usr/share/marker"]).await;
    assert_eq!(code, 0, "{out}");
    out
}

/// Guards `[images] max_tenant_bytes` (issue #43): a tenant whose default
/// image and session images fill its share is refused the next session
/// image (-32006, the quota named with its limit) before its pool starts;
/// that image stays in the store unused, and another tenant's pull evicts
/// it and runs; once one of the first tenant's sessions has ended, its
/// idle pool gives its share back and the refused image runs.
#[tokio::test]
async fn a_tenants_images_in_use_stay_within_its_share_of_the_store() {
    let Some(reg) = registry() else { return };
    let (work, store, _mounts) = scratch();
    for m in ["d", "i0", "i1", "i2"] {
        reg.push(
            &oci::busybox_layout(work.path(), m),
            "v1",
            &format!("team/{m}"),
        );
    }
    reg.push(
        &oci::busybox_layout(work.path(), "beta"),
        "v1",
        "other/beta",
    );
    let r = |repo: &str| reg.reference(repo, "v1");
    let (d, i0, i1, i2, beta) = (
        r("team/d"),
        r("team/i0"),
        r("team/i1"),
        r("team/i2"),
        r("other/beta"),
    );
    // An image's bytes: busybox in whole blocks, and a block per entry
    // (about 24) and per small file, rounded up.
    let bb = std::fs::metadata("/bin/busybox").unwrap().len();
    let img = bb.div_ceil(4096) * 4096 + 32 * 4096;
    // Three images in a's share, not four; four in the store, not five.
    let (share, store_bytes) = (3 * img + img / 2, 4 * img + img / 2);
    let images = images_from(
        &store,
        &reg.addr,
        &format!(
            "max_store_bytes = {store_bytes}\nmax_image_bytes = {img}\nmax_tenant_bytes = {share}\n"
        ),
    );
    let tenants = [("b", Some(beta.clone())), ("a", Some(d.clone()))];
    let prefix = format!("{}/team/*", reg.addr);
    let gw = oci::start_logged(|dir| {
        config(
            dir,
            "[server]\ntenant_idle_timeout = \"1s\"\n",
            &images,
            &tenants,
        ) + &format!("images = [\"{prefix}\"]\n")
    });
    let root = gw.dir.path().join("a");

    // a's default and two session images: three images in use.
    let (mut own, _) = gw.session_of("a").await;
    assert_eq!(marker_of(&mut own, "m", &root).await, "d");
    let mut c0 = gw.connect_as(&gw.token("a")).await;
    let resp = initialize_on(&mut c0, &i0).await;
    assert!(resp.get("result").is_some(), "{resp}");
    let mut c1 = gw.connect_as(&gw.token("a")).await;
    let resp = initialize_on(&mut c1, &i1).await;
    assert!(resp.get("result").is_some(), "{resp}");
    // A fourth is past the share.
    let mut c2 = gw.connect_as(&gw.token("a")).await;
    let resp = initialize_on(&mut c2, &i2).await;
    let e = &resp["error"];
    assert_eq!(e["code"], -32006, "{resp}");
    assert_eq!(
        e["data"]["quota"], "image bytes in use by the tenant",
        "{resp}"
    );
    assert_eq!(e["data"]["limit"], share, "{resp}");
    // Pulled, and held by no view.
    unused(&gw, &i2).await;
    // Another tenant pulls and runs: the store evicts the refused image
    // (the only one no view uses) to make room.
    let b = serves(&gw, "b", "beta", true).await;
    let (_, ready) = gw.admin_get("/readyz").await;
    assert!(!ready.contains(&i2), "{ready}");
    drop(b);
    unused(&gw, &beta).await;

    // i0's only session ends: its idle pool gives the share back.
    c0.call("session/close", json!({})).await;
    drop(c0);
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        let resp = initialize_on(&mut c2, &i2).await;
        if resp.get("result").is_some() {
            break;
        }
        assert_eq!(resp["error"]["code"], -32006, "{resp}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the share never came back: {resp}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(marker_of(&mut c2, "m", &root).await, "i2");
    assert_eq!(marker_of(&mut c1, "m", &root).await, "i1");
    assert_eq!(marker_of(&mut own, "m2", &root).await, "d");
}

// === Sharing a stored layer only with a source that serves it; image shapes ===

/// A registry on a loopback port of its own that serves the layout at
/// `layout`: its image tagged `v1` under any repository and tag, each
/// blob the layout holds, 404 for any other. Keeps the paths asked.
struct Served {
    addr: String,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Served {
    fn start(layout: &Path) -> Served {
        use std::io::Write as _;
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (blobs, log) = (layout.join("blobs/sha256"), asked.clone());
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let manifest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
        let addr = oci::serve_http(move |path, s| {
            log.lock().unwrap().push(path.to_owned());
            let _ = match oci::layout_object(&blobs, &manifest, path) {
                Some((_, body, kind)) => s
                    .write_all(oci::ok_head(kind, body.len()).as_bytes())
                    .and_then(|()| s.write_all(&body)),
                None => s.write_all(oci::NOT_FOUND),
            };
        });
        Served { addr, asked }
    }

    /// How many times blob `digest` was asked for.
    fn gets(&self, digest: &str) -> usize {
        let suffix = format!("/blobs/{digest}");
        let asked = self.asked.lock().unwrap();
        asked.iter().filter(|p| p.ends_with(&suffix)).count()
    }
}

/// Guards (the attack review's blob-digest borrowing, the Kubernetes
/// AlwaysPullImages problem): a stored layer is shared without a download
/// only with a source that has served its blob. Tenant `owner`'s layout
/// image holds a private layer; a registry allowed to tenant `hostile`
/// serves a manifest naming that layer's blob digest and diff_id but not
/// the blob (404): the pull is refused, whether or not the store already
/// has that very manifest from elsewhere, and `hostile` never runs. The
/// same manifest from a registry that serves the blob works, and that
/// registry is asked for the blob (once: the next pull from its
/// repository, another tag, is not); the layer is not unpacked twice.
#[tokio::test]
async fn a_stored_layer_is_shared_only_with_a_source_that_serves_its_blob() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let (work, store, _mounts) = scratch();
    let private = Layer::gzip(&layer(&[
        Entry::Dir("srv", 0o755),
        Entry::File("srv/private", 0o644, b"SECRET".to_vec()),
    ]));
    let private_blob = format!("sha256:{}", oci::sha256_hex(&private.blob));
    let owner = work.path().join("layout-owner");
    let mine = Layer::gzip(&oci::busybox_layer("owner"));
    oci::write_layout(&owner, "v1", &[mine, private], &["PATH=/bin"]);
    // One image naming the owner's private layer over a busybox of its
    // own: the honest registry has all its blobs, the hostile one all but
    // the private layer's.
    let image = |dir: &Path| {
        let private = Layer::gzip(&layer(&[
            Entry::Dir("srv", 0o755),
            Entry::File("srv/private", 0o644, b"SECRET".to_vec()),
        ]));
        let base = Layer::gzip(&oci::busybox_layer("other"));
        oci::write_layout(dir, "v1", &[base, private], &["PATH=/bin"])
    };
    let (honest_dir, hostile_dir) = (work.path().join("honest"), work.path().join("hostile"));
    assert_eq!(image(&honest_dir), image(&hostile_dir), "one manifest");
    std::fs::remove_file(
        hostile_dir
            .join("blobs/sha256")
            .join(private_blob.trim_start_matches("sha256:")),
    )
    .unwrap();
    let (honest, hostile) = (Served::start(&honest_dir), Served::start(&hostile_dir));
    let (h, o) = (&hostile.addr, &honest.addr);
    let images = format!(
        "store = \"{}\"\nregistries = [\"{h}\", \"{o}\"]\ninsecure_registries = [\"{h}\", \"{o}\"]\n",
        store.display()
    );
    let tenants = vec![
        ("owner", Some(format!("oci:{}:v1", owner.display()))),
        ("hostile", Some(format!("{h}/team/b:v1"))),
        ("honest", Some(format!("{o}/team/c:v1"))),
        ("again", Some(format!("{o}/team/c:v2"))),
        // After `honest`: the store has this manifest now.
        ("hostile2", Some(format!("{h}/team/b:v2"))),
    ];
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let mut c = serves(&gw, "owner", "owner", true).await;
    let root = gw.dir.path().join("owner").display().to_string();
    assert_eq!(
        run(&mut c, "p", &root, &["/bin/cat", "/srv/private"])
            .await
            .0,
        "SECRET"
    );
    let layers_before = StoreState::of(&store).layer_dirs().len();
    let told = format!("blobs/{private_blob}: the registry answered 404");
    refused(&gw, &store, "hostile", &told, &told).await;
    assert_eq!(hostile.gets(&private_blob), 1, "the blob was not asked for");
    // The registry that has the blob: asked for it, once.
    let mut c = serves(&gw, "honest", "other", true).await;
    let root = gw.dir.path().join("honest").display().to_string();
    assert_eq!(
        run(&mut c, "p", &root, &["/bin/cat", "/srv/private"])
            .await
            .0,
        "SECRET"
    );
    assert_eq!(honest.gets(&private_blob), 1);
    drop(serves(&gw, "again", "other", true).await);
    assert_eq!(honest.gets(&private_blob), 1, "a proven source asked again");
    // The private layer is stored once; `other`'s busybox is new.
    let s = StoreState::of(&store);
    assert_eq!(s.layer_dirs().len(), layers_before + 1, "{s:?}");
    // The stored image is not handed to a source that lacks its blob.
    refused(&gw, &store, "hostile2", &told, &told).await;
    assert_eq!(hostile.gets(&private_blob), 2);
}

/// Guards the two image shapes the attack review found failing at mount:
/// an image with no layers is refused when it is pulled (-32602, `image
/// refused`), the store untouched (it was stored, then failed to mount
/// with EINVAL); an image listing one layer twice runs (overlayfs refused
/// the same lowerdir twice: ELOOP), its view the same as the image's: the
/// topmost copy's files over the layer between the two.
#[tokio::test]
async fn an_image_without_layers_is_refused_and_a_repeated_layer_runs() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let (work, store, _mounts) = scratch();
    let empty_dir = work.path().join("layout-empty");
    oci::write_layout(&empty_dir, "v1", &[], &["PATH=/bin"]);
    let empty = Served::start(&empty_dir);
    let repeated = work.path().join("layout-repeated");
    let base = oci::busybox_layer("low");
    let mid = layer(&[
        Entry::Dir("usr", 0o755),
        Entry::Dir("usr/share", 0o755),
        Entry::File("usr/share/marker", 0o644, b"mid".to_vec()),
    ]);
    oci::write_layout(
        &repeated,
        "v1",
        &[Layer::gzip(&base), Layer::gzip(&mid), Layer::gzip(&base)],
        &["PATH=/bin"],
    );
    let images = images_from(&store, &empty.addr, "");
    let tenants = vec![
        ("repeated", Some(format!("oci:{}:v1", repeated.display()))),
        ("s", None),
    ];
    let none = format!("{}/team/none:v1", empty.addr);
    let gw = oci::start_logged(|d| {
        config(d, "", &images, &tenants) + &format!("images = [\"{none}\"]\n")
    });
    // The upper copy of busybox's layer, marker and all, over `mid`'s.
    drop(serves(&gw, "repeated", "low", true).await);
    let before = StoreState::of(&store);
    let mut c = gw.connect_as(&gw.token("s")).await;
    let resp = initialize_on(&mut c, &none).await;
    assert_eq!(resp["error"]["code"], -32602, "{resp}");
    let message = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("image refused: the manifest names no layers"),
        "{resp}"
    );
    let after = StoreState::of(&store);
    assert_eq!(after, before, "the refused image changed the store");
}

/// Guards (the attack review's port probe, issue #43): a blob's redirect
/// from a listed registry to the gateway's own network (an IP literal in
/// loopback on a port no one listed, `localhost`) or with credentials in
/// its URL is refused before any connection: the listener it points at
/// sees none. A registry that cannot be reached is told as "could not
/// connect". In each case the tenant reads no io, TLS or DNS error text
/// (were it there, "connection refused" against "tls handshake eof" would
/// tell which ports of the gateway's network are open); the log has it.
#[tokio::test]
async fn a_blob_redirect_into_the_gateways_network_is_refused_and_io_errors_stay_in_the_log() {
    // What a redirect aims at: any connection to it is a probe made.
    let target = Liar::start(|_, _| http("200 OK", ""));
    let port = target.addr.rsplit(':').next().unwrap().to_owned();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let marked = layer(&[
        Entry::Dir("usr", 0o755),
        Entry::File("usr/marker", 0o644, b"x".to_vec()),
    ]);
    let digest = oci::write_layout(&layout, "v1", &[Layer::gzip(&marked)], &[]);
    let manifest = std::fs::read_to_string(
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .unwrap();
    let p = port.clone();
    let registry = Liar::start(move |_, path| {
        if path.contains("/manifests/") {
            return Some(format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{manifest}",
                manifest.len()
            ));
        }
        let to = match path.split('/').nth(2).unwrap_or("") {
            "loop" => format!("https://127.0.0.1:{p}/blob"),
            "local" => format!("https://localhost:{p}/blob"),
            _ => "https://user:pw@example.invalid/blob".to_owned(),
        };
        http("307 Temporary Redirect", &format!("location: {to}\r\n"))
    });
    // A listed registry where nothing listens.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let store = work.path().join("store");
    let list = format!("\"{}\", \"{down}\"", registry.addr);
    let images = format!(
        "store = \"{}\"\nregistries = [{list}]\ninsecure_registries = [{list}]\n",
        store.display()
    );
    let r = &registry.addr;
    let tenants = vec![
        ("loop", Some(format!("{r}/loop:v1"))),
        ("local", Some(format!("{r}/local:v1"))),
        ("creds", Some(format!("{r}/creds:v1"))),
        ("down", Some(format!("{down}/r:v1"))),
    ];
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let own = "redirect was refused: to an address of the gateway's own network";
    for (t, told) in [
        ("loop", own),
        ("local", own),
        ("creds", "redirect was refused: credentials in its URL"),
        ("down", "could not connect"),
    ] {
        refused(&gw, &store, t, told, told).await;
        let (_, body) = gw
            .handshake("/", Some(&format!("Bearer {}", gw.token(t))))
            .await;
        let lower = body.to_lowercase();
        for io in [
            "connection refused",
            "os error",
            "tls",
            "eof",
            "dns",
            "lookup",
            "error sending request",
            "example.invalid",
            "user:pw",
            &format!(":{port}"),
        ] {
            assert!(!lower.contains(io), "tenant {t} was told {io:?}: {body:?}");
        }
    }
    assert_eq!(
        target.hits(),
        0,
        "a redirect reached a port of the gateway's network"
    );
    // The cause is the operator's to read.
    let log = oci::gateway_log(&gw);
    let why = log
        .iter()
        .filter(|l| l["fields"]["message"] == "registry transfer failed")
        .filter_map(|l| l["fields"]["error"].as_str())
        .collect::<Vec<_>>();
    assert!(
        why.iter()
            .any(|e| e.to_lowercase().contains("connection refused")),
        "the log lacks the io error: {why:?}"
    );
}

// === What the attack review found: a deep layer, a pull past its timeout ===

/// A tar of one empty file per name in `names`, each below `dirs` nested
/// directories `d/d/.../d` (ustar headers: a path of up to 255 bytes
/// without an extension header, 512 bytes an entry).
fn nested(dirs: usize, names: &[String]) -> Vec<u8> {
    let base = vec!["d"; dirs].join("/");
    let mut b = tar::Builder::new(Vec::new());
    for n in names {
        let mut h = tar::Header::new_ustar();
        h.set_path(format!("{base}/{n}")).unwrap();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }
    b.into_inner().unwrap()
}

/// Guards the depth bound (`unpack::MAX_PATH_DEPTH`, 128 components): a
/// layer with a file 129 components deep (the attack nested 2,400, each
/// entry walking them all) is refused as hostile, the layer below it
/// that was committed goes, and the store is as it was; a layer at the
/// bound itself is unpacked and served.
#[tokio::test]
async fn layers_nested_past_the_depth_bound_are_refused() {
    let (work, store, _mounts) = scratch();
    let deep = |depth: usize| {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in [
            ("usr/share/marker".to_owned(), &b"deep"[..]),
            (vec!["d"; depth].join("/"), &b"x"[..]),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            // A GNU long name past 100 bytes.
            b.append_data(&mut h, &path, data).unwrap();
        }
        Layer::gzip(&b.into_inner().unwrap())
    };
    let (at, past) = (
        work.path().join("layout-at"),
        work.path().join("layout-past"),
    );
    oci::write_layout(&at, "v1", &[deep(128)], &[]);
    oci::write_layout(&past, "v1", &[own_layer("past"), deep(129)], &[]);
    let tenants = vec![
        ("at", Some(format!("oci:{}:v1", at.display()))),
        ("past", Some(format!("oci:{}:v1", past.display()))),
        ("host", None),
    ];
    let images = format!("store = \"{}\"\n", store.display());
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    refused(
        &gw,
        &store,
        "past",
        "could not be had",
        "a path deeper than 128 components",
    )
    .await;
    assert!(StoreState::of(&store).layer_dirs().is_empty());
    drop(serves(&gw, "at", "deep", false).await);
    host_tenant_serves(&gw, "host").await;
}

/// Guards a pull past `pull_timeout` (the attack: an unpack went on after
/// its pull was answered, outside `max_concurrent_pulls`, evicting images,
/// and the room it took was never given back): the pull is refused at its
/// timeout with `tmp/` already empty and the store as it was, and then an
/// image that needs the store's whole room but the few MiB the abandoned
/// layer would keep pulls (in the only pull slot).
///
/// The image: a layer of 40,000 files 120 components deep (~156 MiB
/// charged, seconds to unpack), then a layer the registry drips. The
/// refusal comes whenever the timeout fires: mid-unpack (the case
/// guarded) on any machine where that unpack takes more than `pull_timeout`,
/// else during the drip.
#[tokio::test]
async fn a_pull_past_its_timeout_stops_its_unpack_and_gives_its_room_back() {
    let (work, store, _mounts) = scratch();
    let names: Vec<String> = (0..40_000).map(|i| format!("f{i:05}")).collect();
    let heavy = Layer::gzip(&nested(119, &names));
    let drip_layer = Layer::plain(&layer(&[Entry::File("x", 0o644, vec![b'x'; 4096])]));
    let drip_digest = format!("sha256:{}", oci::sha256_hex(&drip_layer.blob));
    let deep = work.path().join("layout-deep");
    let manifest = oci::write_layout(&deep, "v1", &[heavy, drip_layer], &[]);
    let drip = Drip::start(&deep, &manifest, &drip_digest);
    // 2,048 empty files: 8 MiB charged.
    let names: Vec<String> = (0..2048).map(|i| format!("usr/f{i}")).collect();
    let mut entries = vec![
        Entry::Dir("usr", 0o755),
        Entry::Dir("usr/share", 0o755),
        Entry::File("usr/share/marker", 0o644, b"after".to_vec()),
    ];
    entries.extend(names.iter().map(|n| Entry::File(n, 0o644, Vec::new())));
    let after = work.path().join("layout-after");
    oci::write_layout(&after, "v1", &[Layer::plain(&layer(&entries))], &[]);
    let tenants = [
        ("deep", Some(format!("{}/team/deep:v1", drip.addr))),
        ("after", Some(format!("oci:{}:v1", after.display()))),
    ];
    // 160 MiB: the deep layer (40,000 blocks: 156.25 MiB) fits with
    // under 4 MiB to spare, the 8 MiB image alone fits.
    let bound = 160 << 20;
    // Scaled like the tests' waits: the 8 MiB image must pull within it
    // under the VM lane's emulation too, and on a host where this target's
    // other tests unpack beside it (at 2 s, five attempts in a row timed
    // out there, before and after the change that first showed it).
    let timeout = 5 * (common::event_timeout().as_secs() / common::EVENT_TIMEOUT.as_secs());
    let images = images_from(
        &store,
        &drip.addr,
        &format!(
            "max_concurrent_pulls = 1\npull_timeout = \"{timeout}s\"\n\
             max_store_bytes = {bound}\nmax_image_bytes = {bound}\n"
        ),
    );
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    let told = format!("not pulled within images.pull_timeout ({timeout}s)");
    let told = told.as_str();
    refused(&gw, &store, "deep", told, told).await;
    let stopped = oci::logged(&gw, "layer unpack stopped: its pull ended");
    eprintln!("the timeout fired mid-unpack: {}", stopped > 0);
    // The slot and the room are back: the other image is pulled. Its own
    // pull shares the short timeout, so on a loaded machine (its wait for
    // the slot counts) an attempt may time out too: a few are allowed, as
    // a client would retry; what must not happen is that none succeeds.
    let auth = format!("Bearer {}", gw.token("after"));
    let mut attempts = Vec::new();
    for _ in 0..5 {
        let (status, body) = gw.handshake_pulled("/", Some(&auth)).await;
        attempts.push(status);
        if status == 101 || !body.contains("could not be had") {
            break;
        }
    }
    assert_eq!(attempts.last(), Some(&101), "attempts: {attempts:?}");
    drop(serves(&gw, "after", "after", false).await);
}

/// Guards (attack review, round 3): a pull of a blob that names another
/// layer's diff_id (a hostile registry's, dripping, then refused for its
/// content) holds up no pull of that layer from its own blob. Pulls of a
/// layer were made one at a time per diff_id, so the hostile one kept the
/// honest one waiting (past its handshake) for as long as it dripped.
#[tokio::test]
async fn a_blob_naming_a_layers_diff_id_holds_up_no_other_pull_of_that_layer() {
    let (work, store, _mounts) = scratch();
    let honest = oci::busybox_layout(work.path(), "honest");
    let mut diff_id = String::new();
    oci::edit_config(&honest, "v1", |c| {
        diff_id = c["rootfs"]["diff_ids"][0].as_str().unwrap().to_owned();
    });
    // Other content, whose config names the honest layer's diff_id.
    let hostile_layer = Layer::plain(&layer(&[Entry::File("x", 0o644, vec![b'x'; 4096])]));
    let slow = format!("sha256:{}", oci::sha256_hex(&hostile_layer.blob));
    let hostile = work.path().join("layout-hostile");
    oci::write_layout(&hostile, "v1", &[hostile_layer], &[]);
    oci::edit_config(&hostile, "v1", |c| {
        c["rootfs"]["diff_ids"] = json!([diff_id]);
    });
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hostile.join("index.json")).unwrap()).unwrap();
    let manifest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let drip = Drip::start(&hostile, &manifest, &slow);
    let tenants = [
        ("hostile", Some(format!("{}/team/x:v1", drip.addr))),
        ("honest", Some(format!("oci:{}:v1", honest.display()))),
    ];
    let images = images_from(&store, &drip.addr, "");
    let gw = oci::start_logged(|d| config(d, "", &images, &tenants));
    // The hostile pull, in its tenant's first handshake, until its blob drips.
    let hostile_handshake = handshake_within(&gw, "hostile", common::event_timeout() * 3);
    tokio::pin!(hostile_handshake);
    while !drip.dripping.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::select! {
            r = &mut hostile_handshake => panic!("the hostile pull ended before its blob dripped: {r:?}"),
            () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
        }
    }
    // Meanwhile the honest tenant's image, the same layer, is pulled and runs.
    drop(serves(&gw, "honest", "honest", true).await);
}
