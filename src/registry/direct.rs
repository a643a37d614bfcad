//! Codex 0.169.0's direct transport (`exec-server --remote URL
//! --remote-transport direct --aws-sigv4`, docs/executors.md): an
//! executor registers once at `POST /cloud/environment/{id}/direct/register`
//! and dials the URL it gets back as a websocket, again after every
//! disconnect, without registering anew. Both requests are SigV4-signed
//! with an access key configured for a pool.
//!
//! - The URL carries a registration token (HS256, the tickets' key, so any
//!   replica of a fleet takes the re-dial) naming the executor, its pool
//!   and the key; every dial must be signed by that key, and a dial after
//!   `registration_ttl` gets 409, on which the executor registers again
//!   (the access key is checked afresh, revocations included).
//! - A signature is used once: a replay of a captured request within the
//!   clock-skew window is refused (a dial with 503, which the real
//!   executor retries a moment later with a new signature; two dials of
//!   one second carry the same signature). Seen signatures are kept per
//!   replica and per access key, each until it leaves the window: one
//!   key's holder can fill only its own key's share (its own executors'
//!   signed requests then get 503 until some leave the window), never
//!   another key's or another pool's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use hyper::HeaderMap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::sigv4::{self, Scope, Verified};
use super::ticket::{Credential, Registration, RegistrationError, Ticket, now_secs};
use super::{Pool, Refusal, Registry};
use crate::config::{AccessKey, is_executor_id};

/// Signatures remembered per access key within the clock-skew window;
/// past it, that key's signed requests are refused (503) until some leave
/// the window. Other keys are not affected. 8,192 in a window of ±5
/// minutes is about 14 signed requests a second, sustained, per key (an
/// executor signs one per registration and one per dial).
pub const MAX_SEEN_SIGNATURES_PER_KEY: usize = 8_192;

/// The only transport a direct registration may ask for.
pub const DIRECT_TRANSPORT: &str = "direct_jsonrpc_v1";

/// A signature, as remembered ([`sig_bytes`]).
type Sig = [u8; 32];

/// One access key's signatures already used, each until it could no
/// longer verify.
#[derive(Default)]
struct Seen {
    until: HashMap<Sig, u64>,
    /// The same, soonest to expire first.
    expiry: BinaryHeap<Reverse<(u64, Sig)>>,
}

impl Seen {
    /// Forget the signatures that can no longer verify.
    fn expire(&mut self, now: u64) {
        while let Some(Reverse((until, _))) = self.expiry.peek() {
            if *until >= now {
                break;
            }
            if let Some(Reverse((_, sig))) = self.expiry.pop() {
                self.until.remove(&sig);
            }
        }
    }
}

/// Signatures already used, per access key (only keys whose signature
/// verified, so configured ones: as many shares as keys, each bounded).
#[derive(Default)]
pub(super) struct Replays(Mutex<ReplayState>);

#[derive(Default)]
struct ReplayState {
    keys: HashMap<String, Seen>,
    /// When every key's share was last swept (a key removed by reload
    /// is forgotten once its signatures expire).
    swept: u64,
}

impl Replays {
    /// Whether `v`'s signature is new (and remember it).
    fn first_use(&self, v: &Verified, skew: u64) -> Result<bool, Refusal> {
        let now = now_secs();
        let sig = sig_bytes(&v.signature);
        let mut state = self.0.lock();
        if state.swept != now {
            state.swept = now;
            state.keys.retain(|_, seen| {
                seen.expire(now);
                !seen.until.is_empty()
            });
        }
        let seen = state.keys.entry(v.access_key.clone()).or_default();
        seen.expire(now);
        if seen.until.contains_key(&sig) {
            return Ok(false);
        }
        if seen.until.len() >= MAX_SEEN_SIGNATURES_PER_KEY {
            return Err(Refusal::new(
                503,
                "busy",
                format!(
                    "too many signed requests with access key {} within the clock-skew window; retry later",
                    v.access_key
                ),
            ));
        }
        let until = v.signed_at.saturating_add(skew);
        seen.until.insert(sig, until);
        seen.expiry.push(Reverse((until, sig)));
        Ok(true)
    }
}

/// A signature as remembered: the SHA-256 of its text (32 bytes, one value
/// per spelling, whatever the signature's own length).
fn sig_bytes(signature: &str) -> Sig {
    use sha2::Digest as _;
    sha2::Sha256::digest(signature.as_bytes()).into()
}

/// A direct registration's body.
#[derive(Debug, Deserialize)]
pub struct DirectRegisterBody {
    pub transport: String,
}

/// The answer Codex 0.169.0 requires.
#[derive(Debug, Serialize, Deserialize)]
pub struct DirectRegistered {
    pub environment_id: String,
    pub transport: String,
    pub registration_id: String,
    pub url: String,
}

impl Registry {
    fn scope(&self) -> Scope {
        Scope {
            region: self.settings.sigv4_region.clone(),
            service: self.settings.sigv4_service.clone(),
            max_skew: self.settings.max_clock_skew,
        }
    }

    /// Verify a signed request: the access key's pool and the key.
    /// Verify a signed request and use its signature up (`replayed`: the
    /// refusal of a signature seen before): the access key's pool and key.
    fn signed(
        &self,
        method: &str,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
        replayed: Refusal,
    ) -> Result<(Arc<Pool>, AccessKey), Refusal> {
        let standing = self.standing();
        let v = sigv4::verify(
            method,
            target,
            headers,
            body,
            &self.scope(),
            SystemTime::now(),
            |k| standing.keys.get(k).map(|(_, key)| key.secret.as_slice()),
        )
        .map_err(|e| {
            self.refused(e.reason());
            Refusal::new(401, "unauthenticated", format!("SigV4: {e}"))
        })?;
        let (pool, key) = standing
            .keys
            .get(&v.access_key)
            .cloned()
            .ok_or_else(|| Refusal::new(401, "unauthenticated", "unknown access key"))?;
        if !self
            .replays
            .first_use(&v, self.settings.max_clock_skew.as_secs())?
        {
            return Err(replayed);
        }
        Ok((pool, key))
    }

    fn check_executor(
        &self,
        pool: &Pool,
        key: &AccessKey,
        executor_id: &str,
    ) -> Result<(), Refusal> {
        if !is_executor_id(executor_id) {
            return Err(Refusal::new(
                400,
                "bad_executor_id",
                format!(
                    "an environment id is 1 to {} letters, digits, `_` or `-`",
                    crate::config::MAX_EXECUTOR_ID_BYTES
                ),
            ));
        }
        if let Some(bound) = key.executor_id.as_deref()
            && bound != executor_id
        {
            return Err(Refusal::new(
                403,
                "wrong_executor",
                format!("access key {} registers only environment {bound}", key.id),
            ));
        }
        if key.executor_id.is_none() {
            self.standing().check_reserved(&pool.name, executor_id)?;
        }
        let cred = Credential {
            key: Some(key.id.clone()),
            ..Credential::default()
        };
        if let Some(why) = self.revoked(executor_id, &cred) {
            return Err(Refusal::new(
                403,
                "revoked",
                format!("the credential is revoked ({why})"),
            ));
        }
        Ok(())
    }

    /// `POST /cloud/environment/{id}/direct/register`: `target` is the
    /// request line's path and query, `host` its `Host`.
    pub fn direct_register(
        &self,
        executor_id: &str,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
        host: Option<&str>,
    ) -> Result<DirectRegistered, Refusal> {
        let r = self.try_direct_register(executor_id, target, headers, body, host);
        match &r {
            Ok(_) => {
                self.metrics.registrations.inc();
            }
            Err(e) => self.refused(e.code),
        }
        r
    }

    fn try_direct_register(
        &self,
        executor_id: &str,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
        host: Option<&str>,
    ) -> Result<DirectRegistered, Refusal> {
        let replayed = Refusal::new(401, "replayed", "this signed request was already used");
        let (pool, key) = self.signed("POST", target, headers, body, replayed)?;
        self.check_executor(&pool, &key, executor_id)?;
        let asked: DirectRegisterBody = serde_json::from_slice(body)
            .map_err(|e| Refusal::new(400, "bad_request", format!("registration body: {e}")))?;
        if asked.transport != DIRECT_TRANSPORT {
            return Err(Refusal::new(
                400,
                "bad_transport",
                format!("only the `{DIRECT_TRANSPORT}` transport is served"),
            ));
        }
        pool.check_room(executor_id)?;
        let base = self.base_url(host)?;
        let registration = uuid::Uuid::new_v4().to_string();
        let token = self
            .tickets
            .issue_registration(
                Registration {
                    exe: executor_id.to_owned(),
                    pool: pool.name.clone(),
                    key: key.id.clone(),
                    reg: registration.clone(),
                    exp: 0,
                    aud: String::new(),
                },
                self.settings.registration_ttl,
            )
            .map_err(|e| Refusal::new(500, "internal", e))?;
        tracing::info!(pool = %pool.name, executor = executor_id, access_key = %key.id, "executor registered (direct)");
        Ok(DirectRegistered {
            environment_id: executor_id.to_owned(),
            transport: DIRECT_TRANSPORT.to_owned(),
            registration_id: registration,
            // The token is base64url and dots: nothing to escape, and the
            // path is already normal (the signer signs it as written).
            url: format!("{base}/cloud/environment/{executor_id}/direct/ws?registration={token}"),
        })
    }

    /// A dial of a direct registration's URL, before its upgrade: the
    /// ticket its link is attached under.
    pub fn direct_dial(
        &self,
        executor_id: &str,
        target: &str,
        headers: &HeaderMap,
    ) -> Result<Ticket, Refusal> {
        let r = self.try_direct_dial(executor_id, target, headers);
        if let Err(e) = &r {
            self.refused(e.code);
        }
        r
    }

    fn try_direct_dial(
        &self,
        executor_id: &str,
        target: &str,
        headers: &HeaderMap,
    ) -> Result<Ticket, Refusal> {
        // The real executor signs anew a moment later (503 is retried).
        let replayed = Refusal::new(
            503,
            "replayed",
            "this signed request was already used; sign it again",
        );
        let (pool, key) = self.signed("GET", target, headers, b"", replayed)?;
        let token = target.split_once('?').and_then(|(_, q)| {
            url::form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "registration")
                .map(|(_, v)| v.into_owned())
        });
        let Some(token) = token else {
            return Err(Refusal::new(401, "unauthenticated", "missing registration"));
        };
        let reg = match self.tickets.check_registration(&token, executor_id) {
            Ok(r) => r,
            Err(RegistrationError::Expired) => {
                return Err(Refusal::new(
                    409,
                    "registration_expired",
                    "the registration has expired; register again",
                ));
            }
            Err(RegistrationError::WrongExecutor) => {
                return Err(Refusal::new(
                    401,
                    "unauthenticated",
                    "the registration names another environment",
                ));
            }
            // Signed by a configured key, but a registration this gateway
            // cannot read (issued before a restart of a gateway outside a
            // fleet, whose ticket key is random, or before a fleet key
            // change): register again, which checks the key afresh.
            Err(RegistrationError::Invalid) => {
                return Err(Refusal::new(
                    409,
                    "registration_unknown",
                    "this registration is not known here; register again",
                ));
            }
        };
        if reg.key != key.id || reg.pool != pool.name {
            return Err(Refusal::new(
                401,
                "unauthenticated",
                "the registration belongs to another access key",
            ));
        }
        self.check_executor(&pool, &key, executor_id)?;
        pool.check_room(executor_id)?;
        Ok(Ticket {
            exe: executor_id.to_owned(),
            pool: pool.name.clone(),
            name: executor_id.to_owned(),
            labels: key.labels.clone(),
            reg: reg.reg,
            jti: uuid::Uuid::new_v4().simple().to_string(),
            exp: reg.exp,
            aud: String::new(),
            cred: Credential {
                key: Some(key.id),
                ..Credential::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn signed(key: &str, n: usize, signed_at: u64) -> Verified {
        Verified {
            access_key: key.to_owned(),
            signature: format!("{n:064x}"),
            signed_at,
        }
    }

    /// One key's holder fills what is remembered for its key, with
    /// valid signatures, until refused: another key (another pool's) is
    /// still served, replays of it are still caught, and the flooded key
    /// is served again as its signatures leave the clock-skew window.
    #[test]
    fn one_access_key_cannot_fill_the_replay_cache_of_another() {
        let replays = Replays::default();
        let (now, skew) = (now_secs(), 300);
        let mut sent = 0;
        let refused = loop {
            match replays.first_use(&signed("AKIDFLOOD", sent, now), skew) {
                Ok(fresh) => assert!(fresh, "signature {sent} taken for a replay"),
                Err(e) => break e,
            }
            sent += 1;
            assert!(sent < 1_000_000, "never refused");
        };
        assert_eq!((refused.status, refused.code), (503, "busy"));
        let other = signed("AKIDOTHER", 0, now);
        assert!(replays.first_use(&other, skew).unwrap());
        assert!(!replays.first_use(&other, skew).unwrap(), "replayed");
        // The flooded key's own replays are still recognised as such.
        assert!(
            !replays
                .first_use(&signed("AKIDFLOOD", 0, now), skew)
                .unwrap()
        );
        // Signatures past the window are forgotten: the key has room again.
        let old = Replays::default();
        for n in 0..sent {
            old.first_use(&signed("AKIDFLOOD", n, now - skew - 1), skew)
                .unwrap();
        }
        assert!(
            old.first_use(&signed("AKIDFLOOD", sent, now), skew)
                .unwrap()
        );
    }
}
