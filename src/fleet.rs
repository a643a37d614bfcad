//! This replica's place in a fleet of gateways (docs/fleet.md).
//!
//! - Session ids name their owner: `{replica}.{boot}.{uuid}`, where `boot`
//!   changes at every start, so a session of an earlier run of a replica is
//!   told apart from an unknown one.
//! - Peers are found through configuration only (a static map or a DNS
//!   template for a StatefulSet behind a headless Service): Kubernetes and
//!   DNS are the membership; nothing here votes or gossips.
//! - Peers prove they belong to the fleet with a short-lived token signed
//!   by the shared fleet key, addressed to the replica it is sent to.
//!   Clients' own tokens travel beside it and are verified again by the
//!   owner: a peer vouches for nothing but its membership.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, FleetSettings, PeerDirectory, is_replica_id};
use crate::error::GatewayError;
use crate::tls::client::ClientTlsFiles;
use crate::tls::{ClientTls, Connector};

/// The metadata header carrying the fleet credential.
pub const CREDENTIAL_HEADER: &str = "x-exec-gateway-fleet";
/// The metadata header carrying the client's address (trusted only with a
/// valid credential).
pub const CLIENT_ADDR_HEADER: &str = "x-exec-gateway-client-addr";

/// How long a fleet credential is valid, and how long one is reused.
const CREDENTIAL_LIFETIME: Duration = Duration::from_secs(120);
const CREDENTIAL_REUSE: Duration = Duration::from_secs(60);
/// Clock difference tolerated between replicas.
const CREDENTIAL_LEEWAY_SECS: u64 = 30;
/// Peer channels kept; past this the cache starts over (ids naming
/// replicas that do not exist must not grow it without bound).
const MAX_PEER_CHANNELS: usize = 256;
/// HTTP/2 windows between replicas: relayed output is bulk.
const PEER_STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
const PEER_CONNECTION_WINDOW_BYTES: u32 = 32 * 1024 * 1024;

/// Who owns a session, as its id says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// This replica (or an id from a gateway outside any fleet).
    Local,
    /// Another replica.
    Peer(&'a str),
    /// An earlier run of this replica: the session died with it.
    Restarted(&'a str),
}

/// The replica and boot an id names, if it names any.
pub fn parse_owner(session_id: &str) -> Option<(&str, &str)> {
    let mut parts = session_id.splitn(3, '.');
    let (replica, boot, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let boot_ok = boot.len() == 8 && boot.bytes().all(|b| b.is_ascii_hexdigit());
    (is_replica_id(replica) && boot_ok && !rest.is_empty()).then_some((replica, boot))
}

/// The id of a session on a remote executor:
/// `[{replica}.]x-{executor}@{pool}.{the executor's own session id}` (the
/// replica part in a fleet). It names no boot: the session outlives a
/// restart of the replica, on the executor, and is found again there once
/// the executor's links land on the replica. It names the pool: one
/// executor id may be registered in two pools (two tenants'), and their
/// sessions' ids must never meet.
pub fn remote_session_id(
    replica: Option<&str>,
    pool: &str,
    executor: &str,
    session: &str,
) -> String {
    match replica {
        Some(r) => format!("{r}.x-{executor}@{pool}.{session}"),
        None => format!("x-{executor}@{pool}.{session}"),
    }
}

/// A parsed [`remote_session_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteId<'a> {
    pub replica: Option<&'a str>,
    /// `None` in an id minted before ids named their pool.
    pub pool: Option<&'a str>,
    pub executor: &'a str,
    pub session: &'a str,
}

/// Longest session id of an executor accepted.
pub const MAX_EXECUTOR_SESSION_ID_BYTES: usize = 128;

/// An executor's own session id: printable, no spaces or quotes.
pub fn is_executor_session_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_EXECUTOR_SESSION_ID_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Parse a remote session id; `fleet` says whether ids carry a replica.
pub fn parse_remote(id: &str, fleet: bool) -> Option<RemoteId<'_>> {
    let (replica, rest) = if fleet {
        let (r, rest) = id.split_once('.')?;
        (is_replica_id(r).then_some(r)?, rest)
    } else {
        ("", id)
    };
    let rest = rest.strip_prefix("x-")?;
    let (head, session) = rest.split_once('.')?;
    let (executor, pool) = match head.split_once('@') {
        Some((e, p)) => (e, Some(p)),
        None => (head, None),
    };
    // A pool's name: letters, digits, `_` and `-` (as the config takes).
    let pool_ok = pool.is_none_or(|p| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    });
    (pool_ok && crate::config::is_executor_id(executor) && is_executor_session_id(session))
        .then_some(RemoteId {
            replica: fleet.then_some(replica),
            pool,
            executor,
            session,
        })
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    /// The sending replica.
    iss: String,
    /// The receiving replica.
    aud: String,
    exp: u64,
    iat: u64,
}

struct Cached {
    token: String,
    minted: SystemTime,
}

/// This replica's fleet identity and its peers.
pub struct Fleet {
    pub replica: String,
    boot: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    peers: PeerDirectory,
    pub dial_timeout: Duration,
    channels: Mutex<HashMap<String, tonic::transport::Channel>>,
    credentials: Mutex<HashMap<String, Cached>>,
    /// `[fleet.tls]`: peers are dialled over mutual TLS.
    tls: Option<Arc<ClientTls>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("replica", &self.replica)
            .field("boot", &self.boot)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    pub fn new(s: &FleetSettings) -> Result<Fleet, ConfigError> {
        let tls = match &s.tls {
            None => None,
            Some(t) => Some(
                ClientTls::load(
                    &ClientTlsFiles {
                        ca: Some(t.ca.clone()),
                        identity: Some((t.cert.clone(), t.key.clone())),
                    },
                    &[crate::tls::ALPN_H2],
                    "fleet.tls",
                )
                .map_err(|e| ConfigError(format!("fleet.tls: {e}")))?,
            ),
        };
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).map_err(|e| ConfigError(format!("no randomness: {e}")))?;
        Ok(Fleet {
            replica: s.replica.clone(),
            boot: b.iter().map(|x| format!("{x:02x}")).collect(),
            encoding: EncodingKey::from_secret(&s.key.0),
            decoding: DecodingKey::from_secret(&s.key.0),
            peers: s.peers.clone(),
            dial_timeout: s.dial_timeout,
            channels: Mutex::new(HashMap::new()),
            credentials: Mutex::new(HashMap::new()),
            tls,
        })
    }

    /// What every session id minted here starts with.
    pub fn session_prefix(&self) -> String {
        format!("{}.{}.", self.replica, self.boot)
    }

    pub fn owner<'a>(&self, session_id: &'a str) -> Owner<'a> {
        if let Some(remote) = parse_remote(session_id, true) {
            return match remote.replica {
                Some(r) if r != self.replica => Owner::Peer(r),
                _ => Owner::Local,
            };
        }
        match parse_owner(session_id) {
            None => Owner::Local,
            Some((r, b)) if r == self.replica => {
                if b == self.boot {
                    Owner::Local
                } else {
                    Owner::Restarted(r)
                }
            }
            Some((r, _)) => Owner::Peer(r),
        }
    }

    /// `HOST:PORT` of `replica`, if the configuration knows it.
    pub fn peer_address(&self, replica: &str) -> Option<String> {
        match &self.peers {
            PeerDirectory::Static(map) => map.get(replica).cloned(),
            PeerDirectory::Template(t) => {
                is_replica_id(replica).then(|| t.replace("{replica}", replica))
            }
        }
    }

    /// A (lazily connected) HTTP/2 channel to `replica`.
    pub fn channel(
        &self,
        session: &str,
        replica: &str,
    ) -> Result<tonic::transport::Channel, GatewayError> {
        let unavailable = |detail: String| GatewayError::OwnerUnavailable {
            session: session.to_owned(),
            replica: replica.to_owned(),
            detail,
        };
        let mut channels = self.channels.lock();
        if let Some(c) = channels.get(replica) {
            return Ok(c.clone());
        }
        let address = self
            .peer_address(replica)
            .ok_or_else(|| unavailable("not a replica of this fleet".to_owned()))?;
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| unavailable(format!("bad peer address `{address}`: {e}")))?
            .connect_timeout(self.dial_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            .initial_stream_window_size(PEER_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(PEER_CONNECTION_WINDOW_BYTES);
        // With `[fleet.tls]` every dial is mutual TLS, with the files as
        // they are at that moment (a rotated certificate is used for the
        // next connection).
        let channel = match &self.tls {
            None => endpoint.connect_lazy(),
            Some(tls) => endpoint.connect_with_connector_lazy(Connector {
                tls: tls.clone(),
                timeout: self.dial_timeout,
            }),
        };
        if channels.len() >= MAX_PEER_CHANNELS {
            channels.clear();
        }
        channels.insert(replica.to_owned(), channel.clone());
        Ok(channel)
    }

    /// A credential proving to `replica` that the bearer is of this fleet.
    pub fn credential(&self, replica: &str) -> Result<String, GatewayError> {
        let now = SystemTime::now();
        let mut cache = self.credentials.lock();
        if let Some(c) = cache.get(replica)
            && now
                .duration_since(c.minted)
                .is_ok_and(|age| age < CREDENTIAL_REUSE)
        {
            return Ok(c.token.clone());
        }
        let secs = now
            .duration_since(UNIX_EPOCH)
            .map_err(|e| GatewayError::Internal(format!("clock: {e}")))?
            .as_secs();
        let claims = Claims {
            iss: self.replica.clone(),
            aud: replica.to_owned(),
            iat: secs,
            exp: secs + CREDENTIAL_LIFETIME.as_secs(),
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|e| GatewayError::Internal(format!("fleet credential: {e}")))?;
        if cache.len() >= MAX_PEER_CHANNELS {
            cache.clear();
        }
        cache.insert(
            replica.to_owned(),
            Cached {
                token: token.clone(),
                minted: now,
            },
        );
        Ok(token)
    }

    /// Check a peer's credential; the sending replica's id.
    pub fn verify(&self, token: &str) -> Result<String, String> {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_audience(&[&self.replica]);
        v.set_required_spec_claims(&["exp", "aud", "iss"]);
        v.leeway = CREDENTIAL_LEEWAY_SECS;
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.decoding, &v).map_err(|e| e.to_string())?;
        let c = data.claims;
        if !is_replica_id(&c.iss) || c.iss == self.replica {
            return Err("issuer is not a peer replica".to_owned());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs();
        if c.iat > now + CREDENTIAL_LEEWAY_SECS
            || c.exp.saturating_sub(c.iat) > CREDENTIAL_LIFETIME.as_secs()
        {
            return Err("credential lifetime out of bounds".to_owned());
        }
        Ok(c.iss)
    }
}

/// Generated code of the fleet's relay protocol
/// (`proto/exec_gateway/fleet/v1/relay.proto`): the peer listener serves
/// it (`transport::fleet`), and previews relay through it
/// (`transport::preview`).
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
    tonic::include_proto!("exec_gateway.fleet.v1");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::FleetKey;
    use std::collections::BTreeMap;

    fn fleet(replica: &str, key: &[u8]) -> Fleet {
        Fleet::new(&FleetSettings {
            replica: replica.to_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            key: FleetKey(key.to_vec()),
            peers: PeerDirectory::Static(BTreeMap::new()),
            dial_timeout: Duration::from_secs(1),
            tls: None,
        })
        .unwrap()
    }

    #[test]
    fn executor_session_ids_name_their_pool_and_never_meet_across_pools() {
        let p = remote_session_id(None, "p", "e1", "s-1");
        let q = remote_session_id(None, "q", "e1", "s-1");
        assert_ne!(p, q, "one executor id in two pools");
        let r = parse_remote(&p, false).unwrap();
        assert_eq!((r.pool, r.executor, r.session), (Some("p"), "e1", "s-1"));
        let id = remote_session_id(Some("gw-1"), "p", "e1", "a.b");
        let r = parse_remote(&id, true).unwrap();
        assert_eq!(
            (r.replica, r.pool, r.session),
            (Some("gw-1"), Some("p"), "a.b")
        );
        // An id minted before ids named their pool is still read.
        let r = parse_remote("x-e1.s-1", false).unwrap();
        assert_eq!((r.pool, r.executor), (None, "e1"));
        for bad in ["x-e1@.s", "x-e1@p.q.s@", "x-@p.s", "x-e1@p/q.s"] {
            assert!(parse_remote(bad, false).is_none(), "{bad}");
        }
    }

    #[test]
    fn ids_name_their_owner_and_its_run() {
        let a = fleet("gw-0", &[7; 32]);
        let id = format!("{}{}", a.session_prefix(), uuid::Uuid::new_v4());
        assert_eq!(a.owner(&id), Owner::Local);
        let b = fleet("gw-1", &[7; 32]);
        assert_eq!(b.owner(&id), Owner::Peer("gw-0"));
        let a_again = fleet("gw-0", &[7; 32]);
        assert_eq!(a_again.owner(&id), Owner::Restarted("gw-0"));
        for plain in [
            "",
            "x",
            &uuid::Uuid::new_v4().to_string(),
            "GW.00000000.x",
            "a.b.c",
        ] {
            assert_eq!(a.owner(plain), Owner::Local, "{plain}");
        }
    }

    #[test]
    fn credentials_are_for_one_replica_and_one_key() {
        let a = fleet("gw-0", &[7; 32]);
        let b = fleet("gw-1", &[7; 32]);
        let c = fleet("gw-2", &[7; 32]);
        let stranger = fleet("gw-1", &[8; 32]);
        let t = a.credential("gw-1").unwrap();
        assert_eq!(b.verify(&t).unwrap(), "gw-0");
        assert!(c.verify(&t).is_err(), "addressed to another replica");
        assert!(stranger.verify(&t).is_err(), "signed with another key");
        assert!(b.verify("not-a-token").is_err());
        let own = b.credential("gw-1").unwrap();
        assert!(b.verify(&own).is_err(), "a replica is not its own peer");
    }

    #[test]
    fn templates_only_name_dns_labels() {
        let mut s = fleet("gw-0", &[7; 32]);
        s.peers = PeerDirectory::Template("{replica}.peers.ns.svc:9470".to_owned());
        assert_eq!(
            s.peer_address("gw-1").as_deref(),
            Some("gw-1.peers.ns.svc:9470")
        );
        assert_eq!(s.peer_address("evil.example.com:80/"), None);
        assert_eq!(s.peer_address("2130706433"), None, "an address, not a name");
        assert_eq!(s.peer_address("0x7f000001"), None);
    }
}
