//! A signed preview grant: one session's port, for one tenant, until a
//! time, at the port's revocation epoch. It travels in a preview URL
//! (`?exg_preview=`) and then in a host-scoped cookie; only a key holder
//! makes one, and a revocation (a new epoch) ends every earlier one.
//!
//! Form: `base64url(JSON payload) "." base64url(HMAC-SHA256)`, the MAC
//! over a domain-separation prefix and the payload's bytes.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Longest grant accepted (a payload names a session id of at most 256
/// bytes, a tenant name and a subject).
pub const MAX_GRANT_BYTES: usize = 2048;

const DOMAIN: &[u8] = b"exec-gateway preview grant v1\n";

/// What a grant says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The tenant whose session it is.
    #[serde(rename = "t")]
    pub tenant: String,
    #[serde(rename = "s")]
    pub session: String,
    #[serde(rename = "p")]
    pub port: u16,
    /// Seconds since the Unix epoch after which it is refused.
    #[serde(rename = "e")]
    pub expires: u64,
    /// The port's revocation epoch when it was minted.
    #[serde(rename = "g")]
    pub epoch: u64,
    /// Who minted it (the token's subject), told to the server inside.
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// Why a grant was refused (said in the audit trail, never in detail to
/// the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Malformed,
    BadSignature,
    Expired,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::BadSignature => "bad signature",
            Refused::Expired => "expired",
        }
    }
}

fn mac(key: &[u8], payload: &[u8]) -> Option<Hmac<Sha256>> {
    // HMAC takes a key of any length: this never fails.
    let mut m = <Hmac<Sha256> as hmac::digest::KeyInit>::new_from_slice(key).ok()?;
    m.update(DOMAIN);
    m.update(payload);
    Some(m)
}

impl Grant {
    /// The grant's text, signed with `key`.
    pub fn sign(&self, key: &[u8]) -> Option<String> {
        let payload = serde_json::to_vec(self).ok()?;
        let tag = mac(key, &payload)?.finalize().into_bytes();
        Some(format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(tag)
        ))
    }

    /// The grant `text` says, if `key` signed it and it has not expired
    /// at `now` (seconds since the Unix epoch).
    pub fn verify(text: &str, key: &[u8], now: u64) -> Result<Grant, Refused> {
        if text.len() > MAX_GRANT_BYTES {
            return Err(Refused::Malformed);
        }
        let (p, t) = text.split_once('.').ok_or(Refused::Malformed)?;
        let payload = URL_SAFE_NO_PAD.decode(p).map_err(|_| Refused::Malformed)?;
        let tag = URL_SAFE_NO_PAD.decode(t).map_err(|_| Refused::Malformed)?;
        mac(key, &payload)
            .ok_or(Refused::BadSignature)?
            .verify_slice(&tag)
            .map_err(|_| Refused::BadSignature)?;
        let g: Grant = serde_json::from_slice(&payload).map_err(|_| Refused::Malformed)?;
        if now >= g.expires {
            return Err(Refused::Expired);
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            tenant: "acme".into(),
            session: "s-1".into(),
            port: 3000,
            expires: 2_000,
            epoch: 0,
            subject: Some("ci".into()),
        }
    }

    #[test]
    fn a_grant_holds_only_under_its_key_and_until_it_expires() {
        let key = [7u8; 32];
        let text = grant().sign(&key).unwrap();
        assert_eq!(Grant::verify(&text, &key, 1_999), Ok(grant()));
        assert_eq!(Grant::verify(&text, &key, 2_000), Err(Refused::Expired));
        assert_eq!(
            Grant::verify(&text, &[8u8; 32], 1_000),
            Err(Refused::BadSignature)
        );
        // Another payload under the same signature.
        let (_, tag) = text.split_once('.').unwrap();
        let mut other = grant();
        other.port = 22;
        let forged = format!(
            "{}.{tag}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&other).unwrap())
        );
        assert_eq!(
            Grant::verify(&forged, &key, 1_000),
            Err(Refused::BadSignature)
        );
        for bad in ["", ".", "a.b", "x", &"a".repeat(MAX_GRANT_BYTES + 1)] {
            assert!(Grant::verify(bad, &key, 0).is_err(), "{bad}");
        }
    }
}
