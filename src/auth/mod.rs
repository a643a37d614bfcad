//! Authentication: a JWT becomes a [`Principal`] (tenant, scopes, subject).
//!
//! Rules (docs/operations.md, "Authentication"): the algorithm comes from the configured key,
//! never from the token header (the header only selects among configured
//! keys of that algorithm); `exp` is required, `iss`/`aud` too when
//! configured; `nbf` is honoured; leeway ≤ 30 s; the tenant claim must name a
//! configured tenant. Tokens, signatures and query strings are never logged.
//!
//! Files: `keys.rs` (key loading, JWKS fetching and caching, the
//! [`Authenticator`]), `verify.rs` (token verification into a
//! [`Principal`], [`AuthError`]), `cert.rs` (a client certificate into a
//! [`Principal`]), `scope.rs`, `mint.rs`, `bearer.rs`.

mod bearer;
mod cert;
mod keys;
mod mint;
mod scope;
mod verify;

pub use bearer::bearer_token;
pub use keys::{Authenticator, KeyLife, KnownTenants};
pub use mint::{mint, mint_executor};
pub use scope::{Scope, Scopes};
pub use verify::{AuthError, EXECUTOR_SCOPE, ExecutorPrincipal, Principal};
