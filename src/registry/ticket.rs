//! Rendezvous tickets: what a registration hands an executor to come back
//! with. A ticket is a short JWT (HS256, a key only gateways hold) naming
//! the executor, its pool and what it registered with; it expires after
//! `ticket_ttl` and is redeemed once.
//!
//! In a fleet every replica derives the same key from the fleet key, so a
//! ticket issued by one replica is redeemed by whichever the balancer picks;
//! a replica remembers the tickets redeemed through it until they expire.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Tickets remembered as redeemed (each until it expires); past it,
/// redemptions are refused until some expire.
pub const MAX_REDEEMED_TICKETS: usize = 65_536;

/// The audience of every ticket: not a token for any other use.
const AUDIENCE: &str = "exec-gateway-rendezvous";

/// What a ticket says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// The executor id.
    pub exe: String,
    pub pool: String,
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The registration id (answered as `id`).
    pub reg: String,
    /// Unique per ticket: what "used" is remembered by.
    pub jti: String,
    pub exp: u64,
    pub aud: String,
    /// The credential the executor registered with: what a revocation
    /// names (`jti`, subject, access key) and when its links end.
    #[serde(default)]
    pub cred: Credential,
}

/// Who an executor registered as.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// A SigV4 access key id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// When the credential expires (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
}

/// A direct (Codex 0.169.0) registration: what its URL carries, dialled
/// again by the executor after every disconnect until it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The executor (environment) id.
    pub exe: String,
    pub pool: String,
    /// The access key that registered; every dial must be signed by it.
    pub key: String,
    pub reg: String,
    pub exp: u64,
    pub aud: String,
}

/// Why a registration URL was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationError {
    /// Not a registration this gateway issued (or can read).
    Invalid,
    /// Issued for another executor.
    WrongExecutor,
    /// Past its time: the executor is told to register again.
    Expired,
}

/// The audience of registration tokens.
const REGISTRATION_AUDIENCE: &str = "exec-gateway-direct-registration";

/// Why a ticket was refused (the fixed label is the metric reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("invalid or expired rendezvous ticket")]
    Invalid,
    #[error("rendezvous ticket already used")]
    Used,
    #[error("the ticket names another executor")]
    WrongExecutor,
    #[error("too many outstanding tickets; retry later")]
    Full,
}

impl TicketError {
    pub fn reason(self) -> &'static str {
        match self {
            TicketError::Invalid => "ticket_invalid",
            TicketError::Used => "ticket_used",
            TicketError::WrongExecutor => "ticket_wrong_executor",
            TicketError::Full => "ticket_full",
        }
    }
}

/// Issues and redeems tickets.
pub struct Tickets {
    encoding: EncodingKey,
    decoding: DecodingKey,
    ttl: Duration,
    redeemed: Mutex<HashMap<String, u64>>,
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Tickets {
    /// Tickets signed with a key derived from `secret` (the fleet key), or
    /// with a fresh random key (a lone gateway: tickets die with it).
    pub fn new(secret: Option<&[u8]>, ttl: Duration) -> Result<Tickets, String> {
        use sha2::Digest as _;
        let key: Vec<u8> = match secret {
            Some(s) => {
                let mut h = sha2::Sha256::new();
                h.update(b"exec-gateway rendezvous tickets v1\0");
                h.update(s);
                h.finalize().to_vec()
            }
            None => {
                let mut k = vec![0u8; 32];
                getrandom::fill(&mut k).map_err(|e| format!("random ticket key: {e}"))?;
                k
            }
        };
        Ok(Tickets {
            encoding: EncodingKey::from_secret(&key),
            decoding: DecodingKey::from_secret(&key),
            ttl,
            redeemed: Mutex::new(HashMap::new()),
        })
    }

    /// A signed ticket for `t` (its `jti`, `exp` and `aud` are set here).
    pub fn issue(&self, mut t: Ticket) -> Result<String, String> {
        t.jti = uuid::Uuid::new_v4().simple().to_string();
        t.exp = now_secs() + self.ttl.as_secs().max(1);
        t.aud = AUDIENCE.to_owned();
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &t, &self.encoding)
            .map_err(|e| e.to_string())
    }

    /// A signed registration token for `r` valid for `ttl` (its `exp` and
    /// `aud` are set here).
    pub fn issue_registration(&self, mut r: Registration, ttl: Duration) -> Result<String, String> {
        r.exp = now_secs() + ttl.as_secs().max(1);
        r.aud = REGISTRATION_AUDIENCE.to_owned();
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &r, &self.encoding)
            .map_err(|e| e.to_string())
    }

    /// Check a registration token dialled for `executor` (not single use).
    pub fn check_registration(
        &self,
        token: &str,
        executor: &str,
    ) -> Result<Registration, RegistrationError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = 0;
        v.validate_exp = false;
        v.set_audience(&[REGISTRATION_AUDIENCE]);
        v.set_required_spec_claims(&["exp", "aud"]);
        let r = jsonwebtoken::decode::<Registration>(token, &self.decoding, &v)
            .map_err(|_| RegistrationError::Invalid)?
            .claims;
        if r.exe != executor {
            return Err(RegistrationError::WrongExecutor);
        }
        if r.exp < now_secs() {
            return Err(RegistrationError::Expired);
        }
        Ok(r)
    }

    /// Check a ticket presented at the rendezvous of `executor`, and mark
    /// it used.
    pub fn redeem(&self, token: &str, executor: &str) -> Result<Ticket, TicketError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = 0;
        v.set_audience(&[AUDIENCE]);
        v.set_required_spec_claims(&["exp", "aud"]);
        let t = jsonwebtoken::decode::<Ticket>(token, &self.decoding, &v)
            .map_err(|_| TicketError::Invalid)?
            .claims;
        if t.exe != executor {
            return Err(TicketError::WrongExecutor);
        }
        let now = now_secs();
        let mut redeemed = self.redeemed.lock();
        if redeemed.len() >= MAX_REDEEMED_TICKETS {
            redeemed.retain(|_, exp| *exp >= now);
            if redeemed.len() >= MAX_REDEEMED_TICKETS {
                return Err(TicketError::Full);
            }
        }
        if redeemed.insert(t.jti.clone(), t.exp).is_some() {
            return Err(TicketError::Used);
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ticket() -> Ticket {
        Ticket {
            exe: "e1".into(),
            pool: "p".into(),
            name: "n".into(),
            labels: BTreeMap::new(),
            reg: "r".into(),
            jti: String::new(),
            exp: 0,
            aud: String::new(),
            cred: Credential::default(),
        }
    }

    #[test]
    fn a_registration_is_checked_for_its_executor_and_time() {
        let t = Tickets::new(None, Duration::from_secs(30)).unwrap();
        let r = Registration {
            exe: "e1".into(),
            pool: "p".into(),
            key: "AK".into(),
            reg: "r".into(),
            exp: 0,
            aud: String::new(),
        };
        let s = t.issue_registration(r, Duration::from_secs(60)).unwrap();
        assert_eq!(t.check_registration(&s, "e1").unwrap().key, "AK");
        assert_eq!(
            t.check_registration(&s, "e1").unwrap().key,
            "AK",
            "reusable"
        );
        assert_eq!(
            t.check_registration(&s, "e2"),
            Err(RegistrationError::WrongExecutor)
        );
        // A rendezvous ticket is not a registration, nor the reverse.
        let ticket = t.issue(ticket()).unwrap();
        assert_eq!(
            t.check_registration(&ticket, "e1"),
            Err(RegistrationError::Invalid)
        );
        assert_eq!(t.redeem(&s, "e1"), Err(TicketError::Invalid));
        let old = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Registration {
                exe: "e1".into(),
                pool: "p".into(),
                key: "AK".into(),
                reg: "r".into(),
                exp: now_secs() - 1,
                aud: REGISTRATION_AUDIENCE.into(),
            },
            &t.encoding,
        )
        .unwrap();
        assert_eq!(
            t.check_registration(&old, "e1"),
            Err(RegistrationError::Expired)
        );
    }

    #[test]
    fn a_ticket_is_redeemed_once_for_its_executor() {
        let t = Tickets::new(None, Duration::from_secs(30)).unwrap();
        let s = t.issue(ticket()).unwrap();
        assert_eq!(t.redeem(&s, "e2"), Err(TicketError::WrongExecutor));
        assert_eq!(t.redeem(&s, "e1").unwrap().pool, "p");
        assert_eq!(t.redeem(&s, "e1"), Err(TicketError::Used));
    }

    #[test]
    fn another_key_or_a_tampered_ticket_is_invalid() {
        let a = Tickets::new(
            Some(b"fleet key one fleet key one fleet"),
            Duration::from_secs(30),
        )
        .unwrap();
        let b = Tickets::new(
            Some(b"fleet key two fleet key two fleet"),
            Duration::from_secs(30),
        )
        .unwrap();
        let same = Tickets::new(
            Some(b"fleet key one fleet key one fleet"),
            Duration::from_secs(30),
        )
        .unwrap();
        let s = a.issue(ticket()).unwrap();
        assert_eq!(b.redeem(&s, "e1"), Err(TicketError::Invalid));
        let mut tampered = s.clone();
        tampered.push('x');
        assert_eq!(a.redeem(&tampered, "e1"), Err(TicketError::Invalid));
        // Another replica of the same fleet redeems it.
        assert!(same.redeem(&s, "e1").is_ok());
    }
}
