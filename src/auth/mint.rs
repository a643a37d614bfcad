//! Minting HS* tokens and executor credentials (`exec-gateway token`,
//! tests).

use std::time::Duration;

use jsonwebtoken::Algorithm;
use serde_json::{Map, Value};

use super::verify::EXECUTOR_SCOPE;
use crate::config::AuthSettings;

/// Mint an HS* token (for `exec-gateway token` and tests of the embedded default).
pub fn mint(
    alg: Algorithm,
    secret: &[u8],
    settings: &AuthSettings,
    tenant: &str,
    scopes: &[String],
    ttl: Duration,
    subject: &str,
) -> Result<String, String> {
    let mut claims = Map::new();
    claims.insert(settings.tenant_claim.clone(), Value::from(tenant));
    claims.insert(settings.scopes_claim.clone(), Value::from(scopes.join(" ")));
    mint_claims(alg, secret, settings, claims, ttl, subject)
}

/// Mint an HS* executor credential for `pool`.
pub fn mint_executor(
    alg: Algorithm,
    secret: &[u8],
    settings: &AuthSettings,
    pool: &str,
    ttl: Duration,
    subject: &str,
) -> Result<String, String> {
    let mut claims = Map::new();
    claims.insert(settings.pool_claim.clone(), Value::from(pool));
    claims.insert(settings.scopes_claim.clone(), Value::from(EXECUTOR_SCOPE));
    mint_claims(alg, secret, settings, claims, ttl, subject)
}

fn mint_claims(
    alg: Algorithm,
    secret: &[u8],
    settings: &AuthSettings,
    mut claims: Map<String, Value>,
    ttl: Duration,
    subject: &str,
) -> Result<String, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    claims.insert("sub".into(), Value::from(subject));
    claims.insert("iat".into(), Value::from(now));
    claims.insert("exp".into(), Value::from(now + ttl.as_secs()));
    if let Some(iss) = &settings.issuer {
        claims.insert("iss".into(), Value::from(iss.as_str()));
    }
    if let Some(aud) = &settings.audience {
        claims.insert("aud".into(), Value::from(aud.as_str()));
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .map_err(|e| e.to_string())
}
