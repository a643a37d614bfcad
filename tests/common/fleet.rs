//! A fleet for the tests: replicas `gw-0`, `gw-1`, … of the real binary,
//! each in a directory of its own, sharing a client key and a fleet key,
//! each one's peer listener on a free loopback port.

use std::path::Path;

use super::{Gateway, free_port, random_secret};

/// What [`launch`] started.
pub struct Replicas {
    pub replicas: Vec<Option<Gateway>>,
    /// The client key (HS256) every replica trusts.
    pub secret: Vec<u8>,
    pub fleet_key: Vec<u8>,
    /// Holds the fleet key's file.
    pub dir: tempfile::TempDir,
}

/// `n` replicas, each configured by `config` (given its directory) and
/// then the `[fleet]` table naming every replica as a peer.
pub fn launch(n: usize, config: impl Fn(&Path) -> String) -> Replicas {
    let dir = tempfile::tempdir().unwrap();
    let fleet_key = random_secret();
    let key_path = dir.path().join("fleet.key");
    std::fs::write(&key_path, &fleet_key).unwrap();
    let secret = random_secret();
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let peers: String = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("gw-{i} = \"127.0.0.1:{p}\"\n"))
        .collect();
    let replicas = (0..n)
        .map(|i| {
            let args = vec![
                "--replica".to_owned(),
                format!("gw-{i}"),
                "--fleet-listen".to_owned(),
                format!("127.0.0.1:{}", ports[i]),
            ];
            Some(Gateway::launch(
                Path::new(env!("CARGO_BIN_EXE_exec-gateway")),
                Some(secret.clone()),
                &args,
                |d| {
                    format!(
                        "{}\n[fleet]\nkey_file = \"{}\"\n[fleet.peers]\n{peers}",
                        config(d),
                        key_path.display()
                    )
                },
            ))
        })
        .collect();
    Replicas {
        replicas,
        secret,
        fleet_key,
        dir,
    }
}

/// Relays replica `gw` has started (its `/metrics`).
pub async fn relays_started(gw: &Gateway) -> u64 {
    let (_, text) = gw.admin_get("/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix("exec_gateway_relays_started_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
