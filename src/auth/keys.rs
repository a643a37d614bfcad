//! The verification keys: configured keys and JWK sets loaded at start, JWKS
//! URLs fetched, cached and refreshed in the background, all held by the
//! [`Authenticator`] (its token verification is in `verify.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};

use super::scope::{Scope, Scopes};
use crate::config::{AuthSettings, KeyAlgorithm, KeySettings, KeySource, MIN_HMAC_SECRET_BYTES};

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
pub(super) struct Key {
    pub(super) kid: Option<String>,
    pub(super) alg: Algorithm,
    pub(super) key: DecodingKey,
    pub(super) binding: Option<Arc<Binding>>,
    /// What the key is (algorithm, kid, material, binding): a reload
    /// that keeps a key with the same fingerprint keeps the key.
    fingerprint: [u8; 32],
    /// Cancelled when a reload removes the key.
    pub(super) life: KeyLife,
}

/// Whether the configured key that verified a token is still configured:
/// a reload that removes it ends the websocket connections and gRPC
/// streams its tokens opened, as each gRPC call then refuses the token. A JWKS URL's keys
/// and certificates are never removed this way.
#[derive(Clone, Default)]
pub struct KeyLife(tokio_util::sync::CancellationToken);

impl KeyLife {
    /// Wait until a reload removes the key.
    pub async fn removed(&self) {
        self.0.cancelled().await;
    }
}

impl std::fmt::Debug for KeyLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyLife(removed: {})", self.0.is_cancelled())
    }
}

/// Which key verified a token is not part of who calls.
impl PartialEq for KeyLife {
    fn eq(&self, _: &KeyLife) -> bool {
        true
    }
}

impl Eq for KeyLife {}

fn fingerprint(
    alg: Algorithm,
    kid: Option<&str>,
    material: &[u8],
    binding: Option<&Arc<Binding>>,
) -> [u8; 32] {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(format!("{alg:?}").as_bytes());
    field(kid.unwrap_or("\0none").as_bytes());
    field(material);
    match binding {
        Some(b) => field(format!("{}\0{:?}", b.tenant, b.scopes).as_bytes()),
        None => field(b"\0unbound"),
    }
    h.finalize().into()
}

/// A key bound to one tenant (`[[auth.keys]] tenant = ...`).
#[derive(Debug)]
pub(super) struct Binding {
    pub(super) tenant: String,
    /// For tokens without a scope claim.
    pub(super) scopes: Scopes,
}

impl Binding {
    fn new(k: &KeySettings) -> Result<Option<Arc<Binding>>, String> {
        let Some(tenant) = &k.tenant else {
            return Ok(None);
        };
        let scopes = match &k.scopes {
            None => Scopes::DEFAULT,
            Some(names) => {
                let mut s = Scopes::default();
                for n in names {
                    if Scope::parse(n).is_none() {
                        let known: Vec<&str> = Scope::ALL.iter().map(|s| s.name()).collect();
                        return Err(format!("unknown scope `{n}` ({})", known.join(", ")));
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
pub(super) struct RemoteJwks {
    url: String,
    pub(super) alg: Algorithm,
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

/// Says whether a tenant claim names a tenant.
pub type KnownTenants = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Verifies tokens against the configured keys.
pub struct Authenticator {
    pub(super) keys: Vec<Key>,
    pub(super) remote: Vec<Arc<RemoteJwks>>,
    pub(super) settings: AuthSettings,
    /// Whether a tenant name has a tenant (configured or templated).
    pub(super) tenants: KnownTenants,
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
            let material = serde_json::to_vec(jwk).unwrap_or_default();
            Some(Key {
                fingerprint: fingerprint(alg, jwk.common.key_id.as_deref(), &material, binding),
                life: KeyLife::default(),
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
    let (key, material) = match &k.source {
        KeySource::Secret(p) => {
            let secret = read_secret(p)?;
            if secret.len() < MIN_HMAC_SECRET_BYTES {
                return Err(format!(
                    "{}: an HS* secret needs at least {MIN_HMAC_SECRET_BYTES} bytes",
                    p.display()
                ));
            }
            (DecodingKey::from_secret(&secret), secret)
        }
        KeySource::PublicKey(p) => {
            let pem = read_file(p)?;
            let key = match alg {
                Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&pem),
                Algorithm::EdDSA => DecodingKey::from_ed_pem(&pem),
                _ => DecodingKey::from_rsa_pem(&pem),
            }
            .map_err(|e| format!("{}: {e}", p.display()))?;
            (key, pem)
        }
        KeySource::JwksFile(p) => {
            let set: JwkSet = serde_json::from_slice(&read_file(p)?)
                .map_err(|e| format!("{}: not a JWK set: {e}", p.display()))?;
            return Ok(keys_from_jwks(&set, alg, binding.as_ref()));
        }
        KeySource::JwksUrl(_) => return Ok(Vec::new()),
    };
    Ok(vec![Key {
        fingerprint: fingerprint(alg, k.kid.as_deref(), &material, binding.as_ref()),
        life: KeyLife::default(),
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
    pub fn new(settings: &AuthSettings, tenants: KnownTenants) -> Result<Self, String> {
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

    /// Take over from `old`, the verifier a reload replaces: a key both
    /// hold stays the same key (tokens it verified stay good); a key only
    /// `old` holds is removed, which ends the connections its tokens
    /// opened.
    pub fn take_over(&mut self, old: &Authenticator) {
        for k in &mut self.keys {
            if let Some(o) = old.keys.iter().find(|o| o.fingerprint == k.fingerprint) {
                k.life = o.life.clone();
            }
        }
        for o in &old.keys {
            if !self.keys.iter().any(|k| k.fingerprint == o.fingerprint) {
                o.life.0.cancel();
            }
        }
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
    pub(super) async fn remote_keys(&self, kid: Option<&str>, alg: Algorithm) -> Vec<Key> {
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
}
