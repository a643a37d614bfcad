//! TLS on the client listeners (`[server.tls]`): real certificates made
//! here (rcgen), a real rustls client, the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::pki::{self, Ca, Leaf};
use common::{Client, Gateway};

/// Two host-rooted tenants and an HS256 key in `dir`.
fn base(dir: &Path) -> String {
    format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
         [tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n",
        dir.display()
    )
}

/// A client trusting `ca_pem` only.
fn trusting(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    pki::client_config(ca_pem, None)
}

fn tls_gateway(first: &Leaf) -> Gateway {
    Gateway::start_with(|d| {
        first.install(d, "tls");
        format!(
            "[server.tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\n{1}",
            d.display(),
            base(d)
        )
    })
}

/// `wss://` serves the JSON-RPC door; a client that does not trust the
/// certificate's CA, or that speaks plaintext, gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_door_speaks_tls_and_only_tls() {
    let a = Ca::new("a");
    let gw = tls_gateway(&a.server());
    assert!(gw.url.starts_with("wss://"), "{}", gw.url);
    let token = gw.token("t1");
    let mut c = Client::connect_tls(&gw.url, &token, trusting(&a.pem))
        .await
        .expect("a client trusting the CA connects");
    let sid = c.initialize().await;
    assert!(!sid.is_empty());
    let other = Ca::new("other");
    let e = Client::connect_tls(&gw.url, &token, trusting(&other.pem))
        .await
        .err()
        .expect("another CA's client is refused");
    assert!(e.to_string().contains("certificate"), "{e}");
    let plain = format!("ws://{}", gw.addr);
    let e = Client::connect_tls(&plain, &token, trusting(&a.pem))
        .await
        .err()
        .expect("plaintext is refused");
    drop(e);
}

/// A certificate replaced on disk is served to the next connection, with
/// no restart; the connection opened before keeps working. A rotation
/// that cannot be read keeps the current certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let a = Ca::new("a");
    let gw = tls_gateway(&a.server());
    let token = gw.token("t1");
    let mut before = Client::connect_tls(&gw.url, &token, trusting(&a.pem))
        .await
        .unwrap();
    before.initialize().await;
    // Broken rotations (a key that is not PEM; a FIFO, whose open would
    // wait for a writer; a device that never ends): the current one stays.
    let key = gw.dir.path().join("tls.key");
    std::fs::write(gw.dir.path().join("tls.key.new"), "not a key").unwrap();
    std::fs::rename(gw.dir.path().join("tls.key.new"), &key).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Client::connect_tls(&gw.url, &token, trusting(&a.pem))
        .await
        .expect("the current certificate is still served");
    std::fs::remove_file(&key).unwrap();
    nix::unistd::mkfifo(&key, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Client::connect_tls(&gw.url, &token, trusting(&a.pem))
        .await
        .expect("still served with a FIFO in the key's place");
    std::fs::remove_file(&key).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &key).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Client::connect_tls(&gw.url, &token, trusting(&a.pem))
        .await
        .expect("still served with a device in the key's place");
    std::fs::remove_file(&key).unwrap();
    // A good rotation, to a certificate of another CA.
    let b = Ca::new("b");
    b.server().install(gw.dir.path(), "tls");
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        if Client::connect_tls(&gw.url, &token, trusting(&b.pem))
            .await
            .is_ok()
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never rotated");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        Client::connect_tls(&gw.url, &token, trusting(&a.pem))
            .await
            .is_err(),
        "the old certificate is no longer served"
    );
    // The connection from before the rotation still works.
    let r = before.call("environment/info", serde_json::json!({})).await;
    assert!(r.get("cwd").is_some(), "{r}");
}

/// A gateway whose certificate files cannot be read does not start.
#[test]
fn unreadable_certificate_files_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(dir.path().join("hs256.key"), common::random_secret()).unwrap();
    std::fs::write(dir.path().join("tls.crt"), "no certificate here").unwrap();
    std::fs::write(
        &config,
        format!(
            "[server.tls]\ncert_file = \"{0}/tls.crt\"\nkey_file = \"{0}/tls.key\"\n{1}",
            dir.path().display(),
            base(dir.path())
        ),
    )
    .unwrap();
    let out = common::serve_refused(&config);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.tls"), "{err}");
}
