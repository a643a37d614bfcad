//! Mutual TLS between replicas (`[fleet.tls]`): a session resumed through
//! another replica crosses a verified TLS link; the peer listener refuses
//! plaintext, clients without a certificate and certificates of another
//! CA, and still asks for the fleet credential and the client's token.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use common::pki::{Ca, Leaf};
use common::{Client, Gateway, free_port, mint, random_secret};
use exec_gateway::tls::client::ClientTlsFiles;
use exec_gateway::tls::{ClientTls, Connector};
use exec_gateway::transport::fleet::relay::pb as relay_pb;
use serde_json::json;
use tonic::Request;

const ALL: &str = "exec fs:read fs:write";

struct Fleet {
    replicas: Vec<Gateway>,
    secret: Vec<u8>,
    fleet_key: Vec<u8>,
    dir: tempfile::TempDir,
}

/// Two replicas on loopback, each with its own certificate of `ca`.
fn start(ca: &Ca) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let fleet_key = random_secret();
    std::fs::write(dir.path().join("fleet.key"), &fleet_key).unwrap();
    let ca_file = ca.write(dir.path(), "fleet-ca.crt");
    let secret = random_secret();
    let ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    let peers: String = (0..2)
        .map(|i| format!("gw-{i} = \"127.0.0.1:{}\"\n", ports[i]))
        .collect();
    let replicas = (0..2)
        .map(|i| {
            let (cert, key) = ca.server().install(dir.path(), &format!("gw-{i}"));
            let args = vec![
                "--replica".to_owned(),
                format!("gw-{i}"),
                "--fleet-listen".to_owned(),
                format!("127.0.0.1:{}", ports[i]),
            ];
            let (fleet_dir, peers, ca_file) =
                (dir.path().to_path_buf(), peers.clone(), ca_file.clone());
            Gateway::launch(
                Path::new(env!("CARGO_BIN_EXE_exec-gateway")),
                Some(secret.clone()),
                &args,
                move |d| {
                    format!(
                        "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}/hs256.key\"\n\
                         [tenants.t1]\nroot = \"/\"\n\
                         [fleet]\nkey_file = \"{}/fleet.key\"\n\
                         [fleet.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nca_file = \"{}\"\n\
                         [fleet.peers]\n{peers}",
                        d.display(),
                        fleet_dir.display(),
                        cert.display(),
                        key.display(),
                        ca_file.display()
                    )
                },
            )
        })
        .collect();
    Fleet {
        replicas,
        secret,
        fleet_key,
        dir,
    }
}

/// A session made on gw-0 and resumed through gw-1 reaches its process
/// over the mutual-TLS peer link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_relayed_over_mutual_tls() {
    let ca = Ca::new("fleet");
    let fleet = start(&ca);
    assert!(fleet.replicas[0].fleet.is_some());
    let token = mint(&fleet.secret, "t1", ALL);
    let mut c = Client::connect(&fleet.replicas[0].url, &token).await;
    let sid = c.initialize().await;
    c.call(
        "process/start",
        json!({"processId": "p", "argv": ["echo", "over-mtls"], "cwd": "/tmp",
               "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
    )
    .await;
    drop(c);
    let mut c = Client::connect(&fleet.replicas[1].url, &token).await;
    let mut r = serde_json::Value::Null;
    for _ in 0..100 {
        r = c
            .call_raw(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": sid}),
            )
            .await;
        if !r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("already attached"))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(r["result"]["sessionId"], sid.as_str(), "{r}");
    c.send(&json!({"method": "initialized"})).await;
    let r = c
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "waitMs": 5000}),
        )
        .await;
    let chunk = r["chunks"][0]["chunk"].as_str().unwrap();
    assert_eq!(common::unb64(chunk), b"over-mtls\n", "{r}");
}

/// A TLS dialler of the peer listener trusting `ca`, showing `identity`.
fn dialler(dir: &Path, ca: &Ca, identity: Option<(&Leaf, &str)>) -> Connector {
    let identity: Option<(PathBuf, PathBuf)> = identity.map(|(l, stem)| l.install(dir, stem));
    let files = ClientTlsFiles {
        ca: Some(ca.write(dir, "trusted.crt")),
        identity,
    };
    Connector {
        tls: ClientTls::load(&files, &[b"h2"], "test").unwrap(),
        timeout: common::event_timeout(),
    }
}

/// An `initialize` through the peer listener's relay service, with the
/// fleet credential and the client token when given; the error, if any.
async fn relay_open(
    peer: &str,
    connector: Option<Connector>,
    credential: Option<&str>,
    token: Option<&str>,
) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{peer}")).unwrap();
    let channel = match connector {
        Some(c) => endpoint.connect_with_connector(c).await,
        None => endpoint.connect().await,
    }
    .map_err(|e| format!("connect: {e:?}"))?;
    let mut req = Request::new(tokio_stream::iter(vec![relay_pb::OpenRequest {
        text: br#"{"id":1,"method":"initialize","params":{"clientName":"x"}}"#
            .to_vec()
            .into(),
    }]));
    if let Some(c) = credential {
        req.metadata_mut()
            .insert("x-exec-gateway-fleet", c.parse().unwrap());
    }
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let mut client = relay_pb::relay_service_client::RelayServiceClient::new(channel);
    let call = client.open(req);
    match tokio::time::timeout(common::event_timeout(), call).await {
        Err(_) => Err("timed out".to_owned()),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Ok(Ok(mut s)) => match s.get_mut().message().await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_listener_requires_a_fleet_certificate() {
    let ca = Ca::new("fleet");
    let fleet = start(&ca);
    let peer = fleet.replicas[0].fleet.clone().unwrap();
    let dir = fleet.dir.path();
    let token = mint(&fleet.secret, "t1", ALL);
    let now = common::now();
    let credential = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"iss": "gw-1", "aud": "gw-0", "iat": now, "exp": now + 60}),
        &jsonwebtoken::EncodingKey::from_secret(&fleet.fleet_key),
    )
    .unwrap();
    let member = ca.server();
    let stranger_ca = Ca::new("stranger");
    let stranger = stranger_ca.server();
    let cases: Vec<(&str, Option<Connector>)> = vec![
        ("plaintext", None),
        ("no client certificate", Some(dialler(dir, &ca, None))),
        (
            "another CA's certificate",
            Some(dialler(dir, &ca, Some((&stranger, "stranger")))),
        ),
    ];
    for (what, connector) in cases {
        let r = relay_open(&peer, connector, Some(&credential), Some(&token)).await;
        assert!(r.is_err(), "{what}: accepted");
    }
    let with_cert = || dialler(dir, &ca, Some((&member, "member")));
    // A fleet certificate is not enough: the fleet credential is still
    // asked for, and the client's own token (the peer's certificate never
    // stands for a client).
    let r = relay_open(&peer, Some(with_cert()), None, Some(&token)).await;
    assert!(
        r.as_ref().is_err_and(|e| e.contains("Unauthenticated")),
        "{r:?}"
    );
    let r = relay_open(&peer, Some(with_cert()), Some(&credential), None).await;
    assert!(
        r.as_ref().is_err_and(|e| e.contains("Unauthenticated")),
        "{r:?}"
    );
    let r = relay_open(&peer, Some(with_cert()), Some(&credential), Some(&token)).await;
    assert_eq!(r, Ok(()));
}
