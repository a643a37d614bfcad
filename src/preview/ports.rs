//! A session's previewed ports: which are public, each one's revocation
//! epoch, and the connections open into them, bounded per session.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::PreviewSettings;

/// Ports of one session with preview state (public, revoked) at once.
/// A port keeps its state once revoked (its epoch keeps earlier URLs
/// dead), so this counts every port ever previewed.
pub const MAX_PORTS_PER_SESSION: usize = 1024;

/// How a preview request was let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A token (or client certificate) of the session's tenant with the
    /// `preview` scope.
    Token,
    /// A signed preview URL or its cookie, minted at `epoch`.
    Url { epoch: u64 },
    /// Nothing: the port is public.
    Public,
}

impl Via {
    pub fn name(&self) -> &'static str {
        match self {
            Via::Token => "token",
            Via::Url { .. } => "url",
            Via::Public => "public",
        }
    }
}

/// Why a preview of a port was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The URL was minted before the port's last revocation.
    Revoked,
    /// Nothing let the caller in: the port is not public.
    NotPublic,
    /// The session has `max_connections_per_session` open.
    Full,
}

struct PortState {
    epoch: u64,
    public: bool,
    /// Cancelled by a revocation: every connection let in before ends.
    revoked: CancellationToken,
}

impl PortState {
    fn new() -> PortState {
        PortState {
            epoch: 0,
            public: false,
            revoked: CancellationToken::new(),
        }
    }
}

/// One session's previews.
pub struct Ports {
    pub settings: Arc<PreviewSettings>,
    ports: Mutex<BTreeMap<u16, PortState>>,
    open: Arc<AtomicUsize>,
}

/// A connection let into a port: holds one of the session's connection
/// slots until dropped; `revoked` ends it.
pub struct Admission {
    pub revoked: CancellationToken,
    _slot: Slot,
}

struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ports {
    pub fn new(settings: Arc<PreviewSettings>) -> Ports {
        Ports {
            settings,
            ports: Mutex::new(BTreeMap::new()),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn with<T>(&self, port: u16, f: impl FnOnce(&mut PortState) -> T) -> Result<T, String> {
        let mut ports = self.ports.lock();
        if !ports.contains_key(&port) && ports.len() >= MAX_PORTS_PER_SESSION {
            return Err(format!(
                "a session keeps preview state for at most {MAX_PORTS_PER_SESSION} ports (revoked ones included)"
            ));
        }
        Ok(f(ports.entry(port).or_insert_with(PortState::new)))
    }

    /// The epoch a URL minted now for `port` carries.
    pub fn epoch(&self, port: u16) -> Result<u64, String> {
        self.with(port, |p| p.epoch)
    }

    /// Open `port` to anyone until revoked.
    pub fn publish(&self, port: u16) -> Result<(), String> {
        self.with(port, |p| p.public = true)
    }

    /// End every URL minted for `port` so far, its public state, and the
    /// connections they let in. Whether it was public.
    pub fn revoke(&self, port: u16) -> bool {
        let mut ports = self.ports.lock();
        let Some(p) = ports.get_mut(&port) else {
            return false;
        };
        let was = p.public;
        p.epoch += 1;
        p.public = false;
        let old = std::mem::take(&mut p.revoked);
        old.cancel();
        was
    }

    /// Whether `port` is public.
    pub fn is_public(&self, port: u16) -> bool {
        self.ports.lock().get(&port).is_some_and(|p| p.public)
    }

    /// Let a connection into `port`, let in by `via`.
    pub fn admit(&self, port: u16, via: &Via) -> Result<Admission, Refusal> {
        let revoked = self.check(port, via)?;
        // Anyone may open a public port: half the session's connections
        // stay for those with a credential.
        let max = self.settings.max_connections_per_session;
        let limit = if *via == Via::Public {
            max.div_ceil(2)
        } else {
            max
        };
        self.slot(revoked, limit)
    }

    /// Whether `via` still lets a request into `port` (a connection made
    /// for an earlier request is used again): the token a revocation
    /// cancels.
    pub fn check(&self, port: u16, via: &Via) -> Result<CancellationToken, Refusal> {
        {
            let ports = self.ports.lock();
            let state = ports.get(&port);
            match via {
                // A token still holds after a revocation: what it opened
                // is not ended by one.
                Via::Token => return Ok(CancellationToken::new()),
                Via::Url { epoch } => {
                    if state.map_or(0, |p| p.epoch) != *epoch {
                        return Err(Refusal::Revoked);
                    }
                }
                Via::Public => {
                    if !state.is_some_and(|p| p.public) {
                        return Err(Refusal::NotPublic);
                    }
                }
            }
            Ok(state.map_or_else(CancellationToken::new, |p| p.revoked.clone()))
        }
    }

    fn slot(&self, revoked: CancellationToken, max: usize) -> Result<Admission, Refusal> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(Refusal::Full);
        }
        Ok(Admission {
            revoked,
            _slot: Slot(self.open.clone()),
        })
    }

    /// Connections open into the session's ports now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Each port with state: its number and whether it is public.
    pub fn list(&self) -> Vec<(u16, bool)> {
        self.ports
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.public))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_ends_urls_public_state_and_connections() {
        let ports = Ports::new(Arc::new(PreviewSettings::default()));
        let e = ports.epoch(3000).unwrap();
        let a = ports.admit(3000, &Via::Url { epoch: e }).unwrap();
        assert!(matches!(
            ports.admit(3000, &Via::Public),
            Err(Refusal::NotPublic)
        ));
        ports.publish(3000).unwrap();
        assert!(ports.admit(3000, &Via::Public).is_ok());
        assert!(ports.revoke(3000));
        assert!(a.revoked.is_cancelled());
        assert!(matches!(
            ports.admit(3000, &Via::Url { epoch: e }),
            Err(Refusal::Revoked)
        ));
        assert!(matches!(
            ports.admit(3000, &Via::Public),
            Err(Refusal::NotPublic)
        ));
        let e2 = ports.epoch(3000).unwrap();
        assert_ne!(e, e2);
        let b = ports.admit(3000, &Via::Url { epoch: e2 }).unwrap();
        assert!(!b.revoked.is_cancelled());
    }

    #[test]
    fn connections_per_session_are_bounded() {
        let settings = PreviewSettings {
            max_connections_per_session: 2,
            ..PreviewSettings::default()
        };
        let ports = Ports::new(Arc::new(settings));
        let a = ports.admit(1, &Via::Token).unwrap();
        let _b = ports.admit(2, &Via::Token).unwrap();
        assert!(matches!(ports.admit(1, &Via::Token), Err(Refusal::Full)));
        drop(a);
        assert!(ports.admit(1, &Via::Token).is_ok());
        assert_eq!(ports.open(), 1);
    }

    #[test]
    fn a_public_port_leaves_half_the_connections_for_credentials() {
        let settings = PreviewSettings {
            max_connections_per_session: 4,
            ..PreviewSettings::default()
        };
        let ports = Ports::new(Arc::new(settings));
        ports.publish(1).unwrap();
        let _a = ports.admit(1, &Via::Public).unwrap();
        let _b = ports.admit(1, &Via::Public).unwrap();
        assert!(matches!(ports.admit(1, &Via::Public), Err(Refusal::Full)));
        let _c = ports.admit(1, &Via::Token).unwrap();
        let _d = ports.admit(1, &Via::Token).unwrap();
        assert!(matches!(ports.admit(1, &Via::Token), Err(Refusal::Full)));
    }

    #[test]
    fn ports_with_state_are_bounded() {
        let ports = Ports::new(Arc::new(PreviewSettings::default()));
        for p in 1..=MAX_PORTS_PER_SESSION as u16 {
            ports.publish(p).unwrap();
        }
        assert!(ports.publish(9999).is_err());
        ports.publish(1).unwrap();
    }
}
