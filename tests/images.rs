//! Images (docs/environments.md): tenants and sessions whose processes see
//! an OCI image as `/`, pulled from a real registry (Debian's
//! `docker-registry`, images pushed with `skopeo`) or imported from a
//! layout; the store shared, bounded and hostile-proof.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::oci::{self, TestRegistry};
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
             [images]\nstore = \"{d}/store\"\nregistries = [\"{r}\"]\ninsecure_registries = [\"{r}\"]\n\
             [tenants.a]\nroot = \"{d}/a\"\nimage = \"{ra}\"\n\
             [tenants.b]\nroot = \"{d}/b\"\nimage = \"{rb}\"\n\
             [tenants.c]\nroot = \"{d}/c\"\n",
            d = d.display()
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
