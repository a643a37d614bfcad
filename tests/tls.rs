//! TLS on the client listeners (`[server.tls]`): real certificates made
//! here (rcgen), a real rustls client, the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Client, Gateway};

/// Two host-rooted tenants and an HS256 key in `dir`.
fn base(dir: &Path) -> String {
    format!(
        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
         [tenants.t1]\nroot = \"/\"\n[tenants.t2]\nroot = \"/\"\n",
        dir.display()
    )
}

/// A CA, and a certificate for 127.0.0.1 it signed.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn pki(name: &str) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} test CA"));
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn install(dir: &Path, p: &Pki) {
    // As a rotation does: the new files replace the old by rename.
    for (name, text) in [("tls.crt", &p.cert_pem), ("tls.key", &p.key_pem)] {
        let tmp = dir.join(format!("{name}.new"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

/// A client trusting `ca_pem` only.
fn trusting(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn tls_gateway(first: &Pki) -> Gateway {
    Gateway::start_with(|d| {
        install(d, first);
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
    let a = pki("a");
    let gw = tls_gateway(&a);
    assert!(gw.url.starts_with("wss://"), "{}", gw.url);
    let token = gw.token("t1");
    let mut c = Client::connect_tls(&gw.url, &token, trusting(&a.ca_pem))
        .await
        .expect("a client trusting the CA connects");
    let sid = c.initialize().await;
    assert!(!sid.is_empty());
    let other = pki("other");
    let e = Client::connect_tls(&gw.url, &token, trusting(&other.ca_pem))
        .await
        .err()
        .expect("another CA's client is refused");
    assert!(e.to_string().contains("certificate"), "{e}");
    let plain = format!("ws://{}", gw.addr);
    let e = Client::connect_tls(&plain, &token, trusting(&a.ca_pem))
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
    let a = pki("a");
    let gw = tls_gateway(&a);
    let token = gw.token("t1");
    let mut before = Client::connect_tls(&gw.url, &token, trusting(&a.ca_pem))
        .await
        .unwrap();
    before.initialize().await;
    // Broken rotations (a key that is not PEM; a FIFO, whose open would
    // wait for a writer; a device that never ends): the current one stays.
    let key = gw.dir.path().join("tls.key");
    std::fs::write(gw.dir.path().join("tls.key.new"), "not a key").unwrap();
    std::fs::rename(gw.dir.path().join("tls.key.new"), &key).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Client::connect_tls(&gw.url, &token, trusting(&a.ca_pem))
        .await
        .expect("the current certificate is still served");
    std::fs::remove_file(&key).unwrap();
    nix::unistd::mkfifo(&key, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Client::connect_tls(&gw.url, &token, trusting(&a.ca_pem))
        .await
        .expect("still served with a FIFO in the key's place");
    std::fs::remove_file(&key).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &key).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Client::connect_tls(&gw.url, &token, trusting(&a.ca_pem))
        .await
        .expect("still served with a device in the key's place");
    std::fs::remove_file(&key).unwrap();
    // A good rotation, to a certificate of another CA.
    let b = pki("b");
    install(gw.dir.path(), &b);
    let deadline = tokio::time::Instant::now() + common::event_timeout();
    loop {
        if Client::connect_tls(&gw.url, &token, trusting(&b.ca_pem))
            .await
            .is_ok()
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never rotated");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        Client::connect_tls(&gw.url, &token, trusting(&a.ca_pem))
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_exec-gateway"))
        .args([
            "serve",
            "--listen",
            "ws://127.0.0.1:0",
            "--admin-listen",
            "off",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.tls"), "{err}");
}
