//! An image's code against the worker that runs it (docs/environments.md,
//! "Security model"): the host's loader starts the tenant's worker inside
//! the image's view, and must run none of the image's code while the
//! worker still holds what it inherited from the gateway. Real gateway,
//! a layout the test writes, a preload library built with the host's C
//! compiler.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

use common::Gateway;
use common::oci::{self, Entry, Layer, layer};
use serde_json::json;

/// A library whose constructor records that it ran (`ROOT/preloaded`)
/// and, for every descriptor it finds open, whether `../` from it reaches
/// the host's `/etc/hostname` (`ROOT/escaped`).
const PRELOAD: &str = r#"
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
__attribute__((constructor)) static void run(void) {
    int m = open(ROOT "/preloaded", O_WRONLY | O_CREAT, 0644);
    if (m >= 0) close(m);
    for (int fd = 3; fd < 256; fd++) {
        int f = openat(fd, "../../../../../../../etc/hostname", O_RDONLY);
        if (f < 0) continue;
        int e = open(ROOT "/escaped", O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (e >= 0) { dprintf(e, "fd %d\n", fd); close(e); }
        close(f);
    }
}
"#;

/// `evil.so` built for a tenant rooted at `root`, or why it cannot be.
fn build_preload(dir: &Path, root: &Path) -> Result<Vec<u8>, String> {
    let src = dir.join("evil.c");
    let out = dir.join("evil.so");
    std::fs::write(&src, PRELOAD).unwrap();
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(format!("-DROOT=\"{}\"", root.display()))
        .arg(&src)
        .status()
        .map_err(|e| format!("gcc: {e}"))?;
    if !status.success() {
        return Err(format!("gcc: {status}"));
    }
    Ok(std::fs::read(&out).unwrap())
}

/// Guards: an image's `/etc/ld.so.preload` does not reach the host's
/// loader when it starts the tenant's worker in the view (the view's
/// skeleton masks it with an empty file). Without the mask the library
/// ran in the worker before it closed its inherited descriptors, one of
/// them a host directory (attack review of #43). The session still runs,
/// and sees the empty file.
#[tokio::test]
async fn an_images_preload_runs_nothing_in_the_worker() {
    if let Some(why) = oci::busybox_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let store = work.path().join("store");
    let mut mounts = oci::Unmounts::default();
    mounts.watch(&store);
    let image = format!("oci:{}:v1", layout.display());
    // The layout is written after the start (the tenant is activated, and
    // its image read, at its first connection): the library names the
    // tenant's root, which is in the gateway's directory.
    let gw = Gateway::start_with(|d| {
        std::fs::create_dir_all(d.join("a")).unwrap();
        format!(
            "[server]\nhandshake_timeout = \"{}s\"\n\
             [[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{d}/hs256.key\"\n\
             [images]\nstore = \"{s}\"\n\
             [tenants.a]\nroot = \"{d}/a\"\nimage = \"{image}\"\n",
            common::event_timeout().as_secs().max(10),
            d = d.display(),
            s = store.display()
        )
    });
    let root = gw.dir.path().join("a");
    let evil = match build_preload(work.path(), &root) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: no C compiler to build the preload library ({why})");
            return;
        }
    };
    let preload = layer(&[
        Entry::Dir("etc", 0o755),
        Entry::File("etc/ld.so.preload", 0o644, b"/evil.so\n".to_vec()),
        Entry::File("evil.so", 0o755, evil),
    ]);
    oci::write_layout(
        &layout,
        "v1",
        &[
            Layer::gzip(&oci::busybox_layer("evil")),
            Layer::gzip(&preload),
        ],
        &["PATH=/bin"],
    );
    let (mut c, _) = gw.session_of("a").await;
    let cwd = root.display().to_string();
    c.call(
        "process/start",
        json!({"processId": "p", "argv": ["/bin/cat", "/etc/ld.so.preload"], "cwd": cwd,
               "env": {"PATH": "/bin"}, "tty": false}),
    )
    .await;
    let out = c.collect("p").await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(
        out.stdout.is_empty(),
        "the image's preload list is seen: {out:?}"
    );
    assert!(
        !root.join("preloaded").exists(),
        "the image's preload library ran in the tenant's worker"
    );
    assert!(
        !root.join("escaped").exists(),
        "the image's code reached the host through an inherited descriptor: {:?}",
        std::fs::read_to_string(root.join("escaped"))
    );
}
