//! Standard Webhooks signatures: `v1,` + base64(HMAC-SHA256(key,
//! "{id}.{timestamp}.{body}")), one per secret, space-separated in
//! `webhook-signature` (several while a secret is being rotated).

use base64::Engine as _;
use hmac::Mac as _;

/// What a secret's text starts with (the spec's and the libraries' form).
pub const SECRET_PREFIX: &str = "whsec_";
/// Shortest key the spec allows (bytes after base64 decoding).
pub const MIN_KEY_BYTES: usize = 24;
/// Longest key the spec allows.
pub const MAX_KEY_BYTES: usize = 64;

/// One signing key. Its bytes never appear in `Debug` or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// `whsec_` + base64 of 24 to 64 bytes (surrounding whitespace, as a
    /// file holds it, is dropped).
    pub fn parse(text: &str) -> Result<Secret, String> {
        let t = text.trim();
        let Some(b64) = t.strip_prefix(SECRET_PREFIX) else {
            return Err(format!(
                "a webhook secret is `{SECRET_PREFIX}` followed by base64 (the Standard Webhooks form)"
            ));
        };
        let key = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("a webhook secret's base64 after `{SECRET_PREFIX}`: {e}"))?;
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key.len()) {
            return Err(format!(
                "a webhook secret decodes to {} bytes; it must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES}",
                key.len()
            ));
        }
        Ok(Secret(key))
    }

    /// `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC takes a key of any length: this cannot fail.
        let Ok(mut mac) = <hmac::Hmac<sha2::Sha256>>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        )
    }
}

/// The `webhook-signature` value: one signature per secret, in order.
pub fn signature(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The example of the Standard Webhooks specification (and of its
    /// reference libraries' tests).
    #[test]
    fn the_specifications_example_signs_as_it_says() {
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            s.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn every_secret_signs_and_a_changed_byte_changes_the_signature() {
        let a = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let b = Secret::parse(&format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        ))
        .unwrap();
        let sig = signature(&[a.clone(), b.clone()], "msg_1", 5, b"{}");
        let parts: Vec<&str> = sig.split(' ').collect();
        assert_eq!(
            parts,
            [a.sign("msg_1", 5, b"{}"), b.sign("msg_1", 5, b"{}")]
        );
        assert_ne!(a.sign("msg_1", 5, b"{}"), a.sign("msg_1", 5, b"{ }"));
        assert_ne!(a.sign("msg_1", 5, b"{}"), a.sign("msg_1", 6, b"{}"));
        assert_ne!(a.sign("msg_1", 5, b"{}"), a.sign("msg_2", 5, b"{}"));
    }

    #[test]
    fn malformed_and_weak_secrets_are_refused() {
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_not base64!").is_err());
        // 12 bytes: under the spec's 24.
        assert!(Secret::parse("whsec_AAAAAAAAAAAAAAAA").is_err());
        assert!(
            format!(
                "{:?}",
                Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            )
            .contains("..")
        );
    }
}
