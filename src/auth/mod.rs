//! Authentication: a JWT becomes a [`Principal`] (tenant, scopes, subject).
//!
//! Rules (docs/operations.md, "Authentication"): the algorithm comes from the configured key,
//! never from the token header (the header only selects among configured
//! keys of that algorithm); `exp` is required, `iss`/`aud` too when
//! configured; `nbf` is honoured; leeway ≤ 30 s; the tenant claim must name a
//! configured tenant. Tokens, signatures and query strings are never logged.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::config::{AuthSettings, KeyAlgorithm, KeySettings, KeySource, MIN_HMAC_SECRET_BYTES};

/// A permission a token grants (docs/protocol.md, "Scopes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `exec`: process/* and command/exec*.
    Exec,
    /// `fs:read`: readFile, getMetadata, readDirectory.
    FsRead,
    /// `fs:write`: writeFile, createDirectory, remove, copy.
    FsWrite,
}

impl Scope {
    /// Every scope, in the order tokens list them.
    pub const ALL: [Scope; 3] = [Scope::Exec, Scope::FsRead, Scope::FsWrite];

    /// The scope's name in tokens and error data.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Exec => "exec",
            Scope::FsRead => "fs:read",
            Scope::FsWrite => "fs:write",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The set of scopes a caller holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub const ALL: Scopes = Scopes(0b111);

    pub fn grants(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Add a scope by name; unknown names are ignored (tokens may carry
    /// scopes meant for other services).
    fn add(&mut self, name: &str) {
        if let Some(s) = Scope::parse(name) {
            self.0 |= s.bit();
        }
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: Arc<str>,
    pub subject: Option<String>,
    pub scopes: Scopes,
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
}

/// The scope of an executor credential.
pub const EXECUTOR_SCOPE: &str = "executor";

/// Who registers an executor: a verified executor credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorPrincipal {
    /// The pool it may join.
    pub pool: String,
    pub subject: Option<String>,
}

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

/// The verification algorithm of a configured key.
fn jwt_algorithm(a: KeyAlgorithm) -> Algorithm {
    match a {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

#[derive(Clone)]
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
    binding: Option<Arc<Binding>>,
}

/// A key bound to one tenant (`[[auth.keys]] tenant = ...`).
#[derive(Debug)]
struct Binding {
    tenant: String,
    /// For tokens without a scope claim.
    scopes: Scopes,
}

impl Binding {
    fn new(k: &KeySettings) -> Result<Option<Arc<Binding>>, String> {
        let Some(tenant) = &k.tenant else {
            return Ok(None);
        };
        let scopes = match &k.scopes {
            None => Scopes::ALL,
            Some(names) => {
                let mut s = Scopes::default();
                for n in names {
                    if Scope::parse(n).is_none() {
                        return Err(format!("unknown scope `{n}` (exec, fs:read, fs:write)"));
                    }
                    s.add(n);
                }
                s
            }
        };
        Ok(Some(Arc::new(Binding {
            tenant: tenant.clone(),
            scopes,
        })))
    }
}

/// A JWKS fetched over HTTPS (plain HTTP only to loopback), never on a
/// handshake's path: a background task fetches it at start and every
/// refresh interval; a token naming a `kid` the cached set lacks asks for an
/// early refresh (at most one in flight, at most one per
/// [`MIN_KID_REFRESH_GAP`]) and waits for it at most
/// `jwks_unknown_kid_wait`. Handshakes with known keys never wait.
struct RemoteJwks {
    url: String,
    alg: Algorithm,
    binding: Option<Arc<Binding>>,
    keys: parking_lot::RwLock<Arc<Vec<Key>>>,
    refresh: parking_lot::Mutex<RefreshState>,
    /// Bumped when a fetch ends (either way).
    fetched: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct RefreshState {
    in_flight: bool,
    last_start: Option<Instant>,
}

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// Shortest gap between two refreshes asked for by unknown `kid`s: a flood
/// of made-up kids costs the issuer one fetch per gap.
const MIN_KID_REFRESH_GAP: Duration = Duration::from_secs(5);

/// Verifies tokens against the configured keys.
pub struct Authenticator {
    keys: Vec<Key>,
    remote: Vec<Arc<RemoteJwks>>,
    settings: AuthSettings,
    tenants: BTreeSet<String>,
    http: reqwest::Client,
    /// Called with each fetch's outcome (`ok`, `error`), for metrics.
    on_fetch: Arc<dyn Fn(&'static str) + Send + Sync>,
}

fn read_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn keys_from_jwks(set: &JwkSet, alg: Algorithm, binding: Option<&Arc<Binding>>) -> Vec<Key> {
    set.keys
        .iter()
        .filter_map(|jwk| {
            // A JWK that names another algorithm is not for this entry.
            if let Some(a) = jwk.common.key_algorithm
                && format!("{a:?}") != format!("{alg:?}")
            {
                return None;
            }
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some(Key {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
                binding: binding.cloned(),
            })
        })
        .collect()
}

fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut secret = read_file(path)?;
    if secret.last() == Some(&b'\n') {
        secret.pop();
    }
    Ok(secret)
}

fn load_key(k: &KeySettings) -> Result<Vec<Key>, String> {
    let alg = jwt_algorithm(k.algorithm);
    let binding = Binding::new(k)?;
    let key = match &k.source {
        KeySource::Secret(p) => {
            let secret = read_secret(p)?;
            if secret.len() < MIN_HMAC_SECRET_BYTES {
                return Err(format!(
                    "{}: an HS* secret needs at least {MIN_HMAC_SECRET_BYTES} bytes",
                    p.display()
                ));
            }
            DecodingKey::from_secret(&secret)
        }
        KeySource::PublicKey(p) => {
            let pem = read_file(p)?;
            match alg {
                Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&pem),
                Algorithm::EdDSA => DecodingKey::from_ed_pem(&pem),
                _ => DecodingKey::from_rsa_pem(&pem),
            }
            .map_err(|e| format!("{}: {e}", p.display()))?
        }
        KeySource::JwksFile(p) => {
            let set: JwkSet = serde_json::from_slice(&read_file(p)?)
                .map_err(|e| format!("{}: not a JWK set: {e}", p.display()))?;
            return Ok(keys_from_jwks(&set, alg, binding.as_ref()));
        }
        KeySource::JwksUrl(_) => return Ok(Vec::new()),
    };
    Ok(vec![Key {
        kid: k.kid.clone(),
        alg,
        key,
        binding,
    }])
}

/// Start a background fetch of `r` unless one is in flight (or, unless
/// `scheduled`, one started less than [`MIN_KID_REFRESH_GAP`] ago). True if
/// one was started.
fn refresh(
    r: &Arc<RemoteJwks>,
    http: &reqwest::Client,
    on_fetch: &Arc<dyn Fn(&'static str) + Send + Sync>,
    scheduled: bool,
) -> bool {
    {
        let mut st = r.refresh.lock();
        let recent = st
            .last_start
            .is_some_and(|t| t.elapsed() < MIN_KID_REFRESH_GAP);
        if st.in_flight || (!scheduled && recent) {
            return false;
        }
        st.in_flight = true;
        st.last_start = Some(Instant::now());
    }
    let (r, http, on_fetch) = (r.clone(), http.clone(), on_fetch.clone());
    crate::task::start("jwks-fetch", async move {
        match fetch_jwks(&http, &r).await {
            Ok(keys) => {
                *r.keys.write() = Arc::new(keys);
                on_fetch("ok");
            }
            Err(e) => {
                // The URL is configuration, not a secret; the error has no token.
                tracing::warn!(url = %r.url, error = %e, "JWKS fetch failed; keeping the cached keys");
                on_fetch("error");
            }
        }
        r.refresh.lock().in_flight = false;
        r.fetched.send_modify(|g| *g += 1);
    });
    true
}

/// One bounded fetch: a 2xx answer (redirects are not followed), at most
/// [`MAX_JWKS_BYTES`], within the client's timeout.
async fn fetch_jwks(http: &reqwest::Client, r: &RemoteJwks) -> Result<Vec<Key>, String> {
    let mut resp = http.get(&r.url).send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    if !status.is_success() {
        return Err(if status.is_redirection() {
            format!("HTTP {status}: redirects are not followed")
        } else {
            format!("HTTP {status}")
        });
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
    {
        return Err("JWKS document too large".to_owned());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err("JWKS document too large".to_owned());
        }
        body.extend_from_slice(&chunk);
    }
    let set: JwkSet = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    Ok(keys_from_jwks(&set, r.alg, r.binding.as_ref()))
}

impl Authenticator {
    /// Load every key. Fails on unreadable or invalid key files; a JWKS URL
    /// is fetched in the background (an unreachable issuer must not stop
    /// the gateway): call [`Authenticator::start`] inside the runtime.
    pub fn new(settings: &AuthSettings, tenants: BTreeSet<String>) -> Result<Self, String> {
        let mut keys = Vec::new();
        let mut remote = Vec::new();
        for k in &settings.keys {
            keys.extend(load_key(k)?);
            if let KeySource::JwksUrl(url) = &k.source {
                crate::config::check_jwks_url(url)?;
                remote.push(Arc::new(RemoteJwks {
                    url: url.clone(),
                    alg: jwt_algorithm(k.algorithm),
                    binding: Binding::new(k)?,
                    keys: parking_lot::RwLock::new(Arc::new(Vec::new())),
                    refresh: parking_lot::Mutex::new(RefreshState::default()),
                    fetched: tokio::sync::watch::channel(0).0,
                }));
            }
        }
        let http = reqwest::Client::builder()
            .timeout(settings.jwks_fetch_timeout)
            .connect_timeout(settings.jwks_fetch_timeout)
            // A redirect could lead anywhere (plain http, another host).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(Self {
            keys,
            remote,
            settings: settings.clone(),
            tenants,
            http,
            on_fetch: Arc::new(|_| {}),
        })
    }

    /// Report each JWKS fetch's outcome to `f`.
    pub fn on_fetch(&mut self, f: impl Fn(&'static str) + Send + Sync + 'static) {
        self.on_fetch = Arc::new(f);
    }

    /// Start the background refresh of every JWKS URL (fetch now, then
    /// every `jwks_refresh_interval`), until `stop` is cancelled.
    pub fn start(&self, stop: tokio_util::sync::CancellationToken) {
        for r in &self.remote {
            let (r, http, on_fetch) = (r.clone(), self.http.clone(), self.on_fetch.clone());
            let interval = self.settings.jwks_refresh_interval;
            let stop = stop.clone();
            crate::task::start("jwks-refresh", async move {
                loop {
                    refresh(&r, &http, &on_fetch, true);
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        () = stop.cancelled() => break,
                    }
                }
            });
        }
    }

    /// The first HS* secret, for `exec-gateway token`.
    pub fn signing_secret(settings: &AuthSettings) -> Option<(Algorithm, Vec<u8>)> {
        settings.keys.iter().find_map(|k| match &k.source {
            KeySource::Secret(path) => Some((jwt_algorithm(k.algorithm), read_secret(path).ok()?)),
            _ => None,
        })
    }

    /// Keys of remote sets matching `kid`. Cached keys answer at once; a
    /// miss asks for a refresh and waits for it at most
    /// `jwks_unknown_kid_wait`.
    async fn remote_keys(&self, kid: Option<&str>, alg: Algorithm) -> Vec<Key> {
        let matching = |r: &RemoteJwks| -> Vec<Key> {
            r.keys
                .read()
                .iter()
                .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
                .cloned()
                .collect()
        };
        let sets: Vec<&Arc<RemoteJwks>> = self.remote.iter().filter(|r| r.alg == alg).collect();
        let found: Vec<Key> = sets.iter().flat_map(|r| matching(r)).collect();
        if !found.is_empty() {
            return found;
        }
        let mut waits = Vec::new();
        for r in &sets {
            let mut rx = r.fetched.subscribe();
            rx.mark_unchanged();
            if refresh(r, &self.http, &self.on_fetch, false) || r.refresh.lock().in_flight {
                waits.push(async move {
                    let _ = rx.changed().await;
                });
            }
        }
        if waits.is_empty() {
            return Vec::new();
        }
        let _ = tokio::time::timeout(
            self.settings.jwks_unknown_kid_wait,
            futures_util::future::join_all(waits),
        )
        .await;
        sets.iter().flat_map(|r| matching(r)).collect()
    }

    /// Verify a client's bearer token: a tenant's, never an executor
    /// credential.
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let (claims, binding) = self.verified_claims(token).await?;
        if has_scope(&claims, &self.settings.scopes_claim, EXECUTOR_SCOPE) {
            return Err(AuthError::ExecutorCredential);
        }
        self.principal(&claims, binding.as_deref())
    }

    /// Verify an executor credential (a registration's bearer token): the
    /// `executor` scope, a pool claim, no tenant claim, and signed by a key
    /// bound to no tenant (a tenant's own key cannot admit executors).
    pub async fn verify_executor(&self, token: &str) -> Result<ExecutorPrincipal, AuthError> {
        let (claims, binding) = self.verified_claims(token).await?;
        if binding.is_some() {
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
        Ok(ExecutorPrincipal {
            pool,
            subject: claims.get("sub").and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// A token's claims once its signature and registered claims hold, and
    /// the tenant binding of the key that verified it.
    async fn verified_claims(
        &self,
        token: &str,
    ) -> Result<(Map<String, Value>, Option<Arc<Binding>>), AuthError> {
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
        if candidates.is_empty() && kid.is_some() {
            // A `kid` no key claims (Codex's tokens may carry one): a
            // configured key without a kid of its own may still verify it.
            candidates = self
                .keys
                .iter()
                .filter(|k| k.alg == header.alg && k.kid.is_none())
                .cloned()
                .collect();
        }
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
                Ok(claims) => return Ok((claims, key.binding.clone())),
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
        if !self.tenants.contains(tenant) {
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
        Ok(Principal {
            tenant: Arc::from(tenant),
            subject: claims.get("sub").and_then(Value::as_str).map(str::to_owned),
            scopes,
        })
    }
}

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

/// The bearer token of an upgrade request: `Authorization: Bearer`, else the
/// `access_token` query parameter (RFC 6750 §2.3).
pub fn bearer_token(authorization: Option<&str>, query: Option<&str>) -> Option<String> {
    if let Some(h) = authorization {
        let h = h.trim();
        if h.len() > 7 && h[..7].eq_ignore_ascii_case("bearer ") {
            return Some(h[7..].trim().to_owned());
        }
    }
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "access_token").then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_from_header_or_query() {
        assert_eq!(
            bearer_token(Some("Bearer abc"), None).as_deref(),
            Some("abc")
        );
        assert_eq!(
            bearer_token(Some("bearer  abc "), None).as_deref(),
            Some("abc")
        );
        assert_eq!(
            bearer_token(None, Some("x=1&access_token=a.b%2Ec")).as_deref(),
            Some("a.b.c")
        );
        assert_eq!(bearer_token(Some("Basic zzz"), None), None);
        assert_eq!(bearer_token(None, Some("x=%")), None);
    }
}
