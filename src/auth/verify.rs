//! Token verification: a JWT checked against the [`Authenticator`]'s keys
//! and its claims turned into a [`Principal`] (or an executor's), or an
//! [`AuthError`] saying why not.

use std::sync::Arc;

use jsonwebtoken::Validation;
use serde_json::{Map, Value};

use super::keys::{Authenticator, Binding, Key};
use super::scope::Scopes;

/// Who is calling.
/// The latest `exp` taken as given: 9999-12-31T23:59:59Z.
const LAST_EXP: u64 = 253_402_300_799;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: Arc<str>,
    pub subject: Option<String>,
    pub scopes: Scopes,
    /// When the token stops being accepted (its `exp` plus the configured
    /// leeway); a connection it opened is closed then. `None`: never (the
    /// operator's stdio, this binary's own executor links).
    pub expires_at: Option<std::time::SystemTime>,
    /// Whether the configured key that verified the token is still
    /// configured.
    pub key: super::KeyLife,
    /// The `image` claim: every session the token opens runs this image.
    pub image: Option<String>,
}

/// Why a token was refused. `reason()` is a fixed label (metrics, logs).
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token")]
    Missing,
    #[error("malformed token")]
    Malformed,
    #[error("no configured key matches the token's algorithm")]
    UnsupportedAlgorithm,
    #[error("unknown key id")]
    UnknownKid,
    #[error("invalid signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token not yet valid")]
    NotYetValid,
    #[error("wrong or missing issuer")]
    Issuer,
    #[error("wrong or missing audience")]
    Audience,
    #[error("missing required claim `{0}`")]
    MissingClaim(String),
    #[error("unknown tenant")]
    UnknownTenant,
    #[error("the token names a tenant its key may not sign for")]
    TenantMismatch,
    #[error("token grants no scope")]
    NoScope,
    #[error("an executor credential cannot open client sessions")]
    ExecutorCredential,
    #[error("not an executor credential: {0}")]
    NotExecutorCredential(&'static str),
    #[error("client certificate: {0}")]
    Certificate(&'static str),
}

/// The scope of an executor credential.
pub const EXECUTOR_SCOPE: &str = "executor";

/// Who registers an executor: a verified executor credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorPrincipal {
    /// The pool it may join.
    pub pool: String,
    pub subject: Option<String>,
    /// The credential's `executor_id` claim: it registers only as that
    /// executor.
    pub executor: Option<String>,
    /// Its `jti` (what a revocation names) and `exp` (when its links end).
    pub jti: Option<String>,
    pub expires: Option<u64>,
}

/// The claim binding an executor credential to one executor id.
pub const EXECUTOR_ID_CLAIM: &str = "executor_id";

/// Whether the scope claim lists `scope`.
fn has_scope(claims: &Map<String, Value>, claim: &str, scope: &str) -> bool {
    match claims.get(claim) {
        Some(Value::String(s)) => s.split_whitespace().any(|s| s == scope),
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(scope)),
        _ => false,
    }
}

impl AuthError {
    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed => "malformed",
            AuthError::UnsupportedAlgorithm => "algorithm",
            AuthError::UnknownKid => "unknown_kid",
            AuthError::BadSignature => "signature",
            AuthError::Expired => "expired",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::Issuer => "issuer",
            AuthError::Audience => "audience",
            AuthError::MissingClaim(_) => "missing_claim",
            AuthError::UnknownTenant => "unknown_tenant",
            AuthError::TenantMismatch => "tenant_mismatch",
            AuthError::NoScope => "no_scope",
            AuthError::ExecutorCredential => "executor_credential",
            AuthError::NotExecutorCredential(_) => "not_executor_credential",
            AuthError::Certificate(_) => "certificate",
        }
    }

    /// As a call error: a valid token that may do nothing here is
    /// forbidden; everything else is unauthenticated.
    pub fn to_gateway_error(&self) -> crate::error::GatewayError {
        use crate::error::GatewayError;
        match self {
            AuthError::NoScope
            | AuthError::ExecutorCredential
            | AuthError::NotExecutorCredential(_) => GatewayError::Forbidden(self.to_string()),
            _ => GatewayError::Unauthenticated(self.to_string()),
        }
    }
}

impl Authenticator {
    /// Verify a client's bearer token: a tenant's, never an executor
    /// credential.
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let (claims, key) = self.verified_claims(token).await?;
        if has_scope(&claims, &self.settings.scopes_claim, EXECUTOR_SCOPE) {
            return Err(AuthError::ExecutorCredential);
        }
        let mut principal = self.principal(&claims, key.binding.as_deref())?;
        principal.key = key.life;
        Ok(principal)
    }

    /// Verify an executor credential (a registration's bearer token): the
    /// `executor` scope, a pool claim, no tenant claim, and signed by a key
    /// bound to no tenant (a tenant's own key cannot admit executors).
    pub async fn verify_executor(&self, token: &str) -> Result<ExecutorPrincipal, AuthError> {
        let (claims, key) = self.verified_claims(token).await?;
        if key.binding.is_some() {
            return Err(AuthError::NotExecutorCredential("signed by a tenant's key"));
        }
        if claims.contains_key(&self.settings.tenant_claim) {
            return Err(AuthError::NotExecutorCredential("a tenant's token"));
        }
        if !has_scope(&claims, &self.settings.scopes_claim, EXECUTOR_SCOPE) {
            return Err(AuthError::NotExecutorCredential("no `executor` scope"));
        }
        let pool = match claims.get(&self.settings.pool_claim) {
            Some(Value::String(p)) if !p.is_empty() => p.clone(),
            _ => return Err(AuthError::MissingClaim(self.settings.pool_claim.clone())),
        };
        let executor = match claims.get(EXECUTOR_ID_CLAIM) {
            None => None,
            Some(Value::String(e)) if !e.is_empty() => Some(e.clone()),
            Some(_) => return Err(AuthError::MissingClaim(EXECUTOR_ID_CLAIM.to_owned())),
        };
        // What a revocation names must be text: a `jti` or `sub` of
        // another type could not be revoked.
        let text = |k: &str| match claims.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(AuthError::MissingClaim(k.to_owned())),
        };
        Ok(ExecutorPrincipal {
            pool,
            subject: text("sub")?,
            executor,
            jti: text("jti")?,
            expires: claims.get("exp").and_then(Value::as_u64),
        })
    }

    /// A token's claims once its signature and registered claims hold, and
    /// the tenant binding of the key that verified it.
    async fn verified_claims(&self, token: &str) -> Result<(Map<String, Value>, Key), AuthError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Malformed)?;
        let kid = header.kid.as_deref();
        let mut candidates: Vec<Key> = self
            .keys
            .iter()
            .filter(|k| k.alg == header.alg && (kid.is_none() || k.kid.as_deref() == kid))
            .cloned()
            .collect();
        if candidates.is_empty() {
            candidates = self.remote_keys(kid, header.alg).await;
        }
        // A `kid` no key of the token's algorithm claims is unknown: a key
        // without a kid of its own never stands in for it (the token
        // names another key, or one that is gone).
        if candidates.is_empty() {
            let alg_known = self.keys.iter().any(|k| k.alg == header.alg)
                || self.remote.iter().any(|r| r.alg == header.alg);
            return Err(if alg_known && kid.is_some() {
                AuthError::UnknownKid
            } else {
                AuthError::UnsupportedAlgorithm
            });
        }
        for key in &candidates {
            match self.decode(token, key) {
                Ok(claims) => return Ok((claims, key.clone())),
                // Another key may sign it.
                Err(AuthError::BadSignature) => continue,
                // The signature held: this key's claims verdict is the answer
                // (expired, not yet valid, wrong issuer...).
                Err(e) => return Err(e),
            }
        }
        Err(AuthError::BadSignature)
    }

    fn decode(&self, token: &str, key: &Key) -> Result<Map<String, Value>, AuthError> {
        use jsonwebtoken::errors::ErrorKind as K;
        let mut v = Validation::new(key.alg);
        v.leeway = self.settings.leeway.as_secs();
        v.validate_exp = true;
        v.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(iss) = &self.settings.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        match &self.settings.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        v.set_required_spec_claims(&required);
        jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &v)
            .map(|d| d.claims)
            .map_err(|e| match e.kind() {
                K::ExpiredSignature => AuthError::Expired,
                K::ImmatureSignature => AuthError::NotYetValid,
                K::InvalidIssuer => AuthError::Issuer,
                K::InvalidAudience => AuthError::Audience,
                K::MissingRequiredClaim(c) => match c.as_str() {
                    "iss" => AuthError::Issuer,
                    "aud" => AuthError::Audience,
                    other => AuthError::MissingClaim(other.to_owned()),
                },
                K::InvalidSignature | K::InvalidAlgorithm => AuthError::BadSignature,
                _ => AuthError::Malformed,
            })
    }

    /// The principal of verified `claims`. A key bound to a tenant fills
    /// in a missing tenant claim (and scope claim) and refuses any other
    /// tenant.
    fn principal(
        &self,
        claims: &Map<String, Value>,
        binding: Option<&Binding>,
    ) -> Result<Principal, AuthError> {
        let claimed = match claims.get(&self.settings.tenant_claim) {
            Some(Value::String(t)) => Some(t.as_str()),
            Some(_) => return Err(AuthError::MissingClaim(self.settings.tenant_claim.clone())),
            None => None,
        };
        let tenant = match (claimed, binding) {
            (Some(t), Some(b)) if t != b.tenant => return Err(AuthError::TenantMismatch),
            (Some(t), _) => t,
            (None, Some(b)) => b.tenant.as_str(),
            (None, None) => {
                return Err(AuthError::MissingClaim(self.settings.tenant_claim.clone()));
            }
        };
        if !(self.tenants)(tenant) {
            return Err(AuthError::UnknownTenant);
        }
        let mut scopes = Scopes::default();
        match claims.get(&self.settings.scopes_claim) {
            Some(Value::String(s)) => s.split_whitespace().for_each(|s| scopes.add(s)),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .for_each(|s| scopes.add(s)),
            _ => {
                if let Some(b) = binding {
                    scopes = b.scopes;
                }
            }
        }
        if scopes.is_empty() {
            return Err(AuthError::NoScope);
        }
        // The verifier accepts the token through the whole second `exp`
        // (plus leeway) and refuses it from the next one on.
        // An `exp` past year 9999 counts as that (the sum would overflow
        // the clock's range and panic).
        let expires_at = claims.get("exp").and_then(Value::as_u64).map(|exp| {
            std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(exp.min(LAST_EXP).saturating_add(1))
                + self.settings.leeway
        });
        Ok(Principal {
            tenant: Arc::from(tenant),
            subject: claims.get("sub").and_then(Value::as_str).map(str::to_owned),
            scopes,
            expires_at,
            key: super::KeyLife::default(),
            image: match claims.get(IMAGE_CLAIM) {
                None => None,
                Some(Value::String(i)) => Some(i.clone()),
                Some(_) => return Err(AuthError::MissingClaim(IMAGE_CLAIM.to_owned())),
            },
        })
    }
}

/// The claim that narrows a token's sessions to one image (a reference
/// among those its tenant may use; docs/environments.md).
pub const IMAGE_CLAIM: &str = "image";
