//! `[images]`: where images come from (the registries allowed, their
//! credentials and TLS), the store they are unpacked into and its bounds
//! (docs/environments.md). Imports only `common`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration, state_dir};

/// Default `[images] max_store_bytes`: what the unpacked layers may hold.
pub const DEFAULT_MAX_STORE_BYTES: u64 = 20 << 30;
/// Default `[images] max_image_bytes`: one image, unpacked.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 8 << 30;
/// Default `[images] max_tenant_bytes` with the default store: half of
/// it. Unset, the share follows the store: half of `max_store_bytes`, and
/// at least `max_image_bytes` (one image always fits a tenant's share).
pub const DEFAULT_MAX_TENANT_BYTES: u64 = DEFAULT_MAX_STORE_BYTES / 2;
/// Default `[images] max_layer_bytes`: one layer as sent (compressed).
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 2 << 30;
/// Default `[images] max_layers`: layers of one image (each is a
/// `lowerdir` of the overlay; its options fit in one page).
pub const DEFAULT_MAX_LAYERS: usize = 40;
/// The most layers an image may have whatever the file says.
pub const MAX_LAYERS: usize = 64;
/// Default `[images] max_entries`: files, directories and links of one
/// image, unpacked (an inode bomb is refused like a byte bomb).
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;
/// Default `[images] max_concurrent_pulls`: images pulled at once (a pull
/// waiting for a slot counts against its own timeout).
pub const DEFAULT_MAX_CONCURRENT_PULLS: usize = 2;
/// Default `[images] pull_timeout`: one image, manifest to last layer.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// Manifests, indexes and configs are JSON documents of at most this.
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;

/// `[images]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// Directory of the store (unpacked layers, image records). Default:
    /// `images` in the state directory.
    pub store: Option<PathBuf>,
    /// Registries images may be pulled from (`host` or `host:port`, as in
    /// a reference). Default: none (only images imported from local OCI
    /// layouts or archives the configuration names).
    #[serde(default)]
    pub registries: Vec<String>,
    /// Registries (also in `registries`) spoken to over plain HTTP.
    /// Default: none.
    #[serde(default)]
    pub insecure_registries: Vec<String>,
    /// A PEM file of CAs trusted for registries besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Credentials by registry: `username` and a `password_file`.
    #[serde(default)]
    pub credentials: BTreeMap<String, CredentialConfig>,
    pub max_store_bytes: Option<u64>,
    pub max_image_bytes: Option<u64>,
    /// One tenant's share of the store: the bytes of the distinct images
    /// its live views use (its default and its sessions' images).
    pub max_tenant_bytes: Option<u64>,
    pub max_layer_bytes: Option<u64>,
    pub max_layers: Option<usize>,
    pub max_entries: Option<u64>,
    pub max_concurrent_pulls: Option<usize>,
    pub pull_timeout: Option<String>,
}

/// `[images.credentials."REGISTRY"]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub username: String,
    /// File holding the password or token (hidden from every tenant).
    pub password_file: PathBuf,
}

/// Validated `[images]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagesSettings {
    pub store: PathBuf,
    pub registries: Vec<String>,
    pub insecure_registries: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub credentials: BTreeMap<String, Credential>,
    pub max_store_bytes: u64,
    pub max_image_bytes: u64,
    /// What the images one tenant's live views use may hold together
    /// (each image's `bytes`, an image two tenants use counted for each).
    pub max_tenant_bytes: u64,
    pub max_layer_bytes: u64,
    pub max_layers: usize,
    pub max_entries: u64,
    pub max_concurrent_pulls: usize,
    pub pull_timeout: Duration,
}

/// A registry's credentials: the password is read when a pull needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password_file: PathBuf,
}

impl ImagesSettings {
    /// The files whose contents are secrets (kept from every tenant).
    pub fn secret_files(&self) -> Vec<PathBuf> {
        self.credentials
            .values()
            .map(|c| c.password_file.clone())
            .collect()
    }

    /// Whether `registry` (`host[:port]`) may be pulled from.
    pub fn allows(&self, registry: &str) -> bool {
        self.registries.iter().any(|r| r == registry)
    }
}

/// A registry name as references write it: a host (name, IPv4 or
/// bracketed IPv6) with an optional port; no scheme, path or user.
fn registry_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        && !name.starts_with(['-', '.', ':'])
}

fn absolute(name: &str, p: &Path) -> Result<PathBuf, ConfigError> {
    if !p.is_absolute() {
        return Err(ConfigError(format!(
            "{name}: `{}` is not absolute",
            p.display()
        )));
    }
    Ok(p.to_owned())
}

impl ImagesConfig {
    pub fn validate(&self) -> Result<ImagesSettings, ConfigError> {
        let store = match &self.store {
            Some(p) => absolute("images.store", p)?,
            None => state_dir()?.join("images"),
        };
        for r in self.registries.iter().chain(&self.insecure_registries) {
            if !registry_name(r) {
                return Err(ConfigError(format!(
                    "images.registries: `{r}` is not a registry name (host or host:port, no scheme)"
                )));
            }
        }
        if let Some(r) = self
            .insecure_registries
            .iter()
            .find(|r| !self.registries.contains(r))
        {
            return Err(ConfigError(format!(
                "images.insecure_registries: `{r}` is not in images.registries"
            )));
        }
        let mut credentials = BTreeMap::new();
        for (r, c) in &self.credentials {
            if !self.registries.contains(r) {
                return Err(ConfigError(format!(
                    "images.credentials.\"{r}\": not in images.registries"
                )));
            }
            if self.insecure_registries.contains(r) {
                // A password sent in the clear to whoever answers.
                return Err(ConfigError(format!(
                    "images.credentials.\"{r}\": credentials are never sent to an insecure (plain HTTP) registry"
                )));
            }
            credentials.insert(
                r.clone(),
                Credential {
                    username: c.username.clone(),
                    password_file: absolute(
                        &format!("images.credentials.\"{r}\".password_file"),
                        &c.password_file,
                    )?,
                },
            );
        }
        let ca_file = self
            .ca_file
            .as_deref()
            .map(|p| absolute("images.ca_file", p))
            .transpose()?;
        let at_least = |name: &str, v: Option<u64>, default: u64, min: u64| match v {
            None => Ok(default),
            Some(n) if n >= min => Ok(n),
            Some(_) => Err(ConfigError(format!("images.{name} must be at least {min}"))),
        };
        let max_layers = self.max_layers.unwrap_or(DEFAULT_MAX_LAYERS);
        if !(1..=MAX_LAYERS).contains(&max_layers) {
            return Err(ConfigError(format!(
                "images.max_layers must be 1 to {MAX_LAYERS}"
            )));
        }
        let max_concurrent_pulls = self
            .max_concurrent_pulls
            .unwrap_or(DEFAULT_MAX_CONCURRENT_PULLS);
        if !(1..=64).contains(&max_concurrent_pulls) {
            return Err(ConfigError(
                "images.max_concurrent_pulls must be 1 to 64".to_owned(),
            ));
        }
        let max_store_bytes = at_least(
            "max_store_bytes",
            self.max_store_bytes,
            DEFAULT_MAX_STORE_BYTES,
            1 << 20,
        )?;
        let max_image_bytes = at_least(
            "max_image_bytes",
            self.max_image_bytes,
            DEFAULT_MAX_IMAGE_BYTES,
            1 << 20,
        )?;
        if max_image_bytes > max_store_bytes {
            return Err(ConfigError(
                "images.max_image_bytes is larger than images.max_store_bytes".to_owned(),
            ));
        }
        // Below one image, a tenant could pull an image it may never run.
        let max_tenant_bytes = match self.max_tenant_bytes {
            None if self.max_store_bytes.is_none() => DEFAULT_MAX_TENANT_BYTES.max(max_image_bytes),
            None => (max_store_bytes / 2).max(max_image_bytes),
            Some(n) if n < max_image_bytes => {
                return Err(ConfigError(
                    "images.max_tenant_bytes is smaller than images.max_image_bytes (a tenant could pull an image it may never run)".to_owned(),
                ));
            }
            Some(n) if n > max_store_bytes => {
                return Err(ConfigError(
                    "images.max_tenant_bytes is larger than images.max_store_bytes".to_owned(),
                ));
            }
            Some(n) => n,
        };
        let s = ImagesSettings {
            store,
            registries: self.registries.clone(),
            insecure_registries: self.insecure_registries.clone(),
            ca_file,
            credentials,
            max_store_bytes,
            max_image_bytes,
            max_tenant_bytes,
            max_layer_bytes: at_least(
                "max_layer_bytes",
                self.max_layer_bytes,
                DEFAULT_MAX_LAYER_BYTES,
                1 << 10,
            )?,
            max_layers,
            max_entries: at_least("max_entries", self.max_entries, DEFAULT_MAX_ENTRIES, 16)?,
            max_concurrent_pulls,
            pull_timeout: duration(
                "images.pull_timeout",
                self.pull_timeout.as_deref(),
                DEFAULT_PULL_TIMEOUT,
            )?,
        };
        Ok(s)
    }
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ImageSource {
    /// A registry reference, canonical (`registry/repository:tag` or
    /// `@sha256:...`), with its registry.
    Registry { reference: String, registry: String },
    /// An OCI image layout directory on the host, and the tag in its
    /// index (`org.opencontainers.image.ref.name`), if one is named.
    Layout { dir: PathBuf, tag: Option<String> },
    /// An `oci-archive` tarball (an OCI layout in a tar file).
    Archive { file: PathBuf, tag: Option<String> },
}

/// Longest image reference accepted (the registry's own bound on a name
/// is 255; a tag 128; a digest 71).
pub const MAX_REFERENCE_LEN: usize = 512;

impl ImageSource {
    /// `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]` (absolute paths), or a
    /// registry reference (`registry/repository[:tag][@digest]`).
    pub fn parse(s: &str) -> Result<ImageSource, String> {
        if s.is_empty() || s.len() > MAX_REFERENCE_LEN || s.chars().any(char::is_control) {
            return Err(format!(
                "an image reference is 1 to {MAX_REFERENCE_LEN} printable characters"
            ));
        }
        let local = |rest: &str| -> Result<(PathBuf, Option<String>), String> {
            let (path, tag) = match rest.rfind(':') {
                Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(rest[i + 1..].to_owned())),
                _ => (rest, None),
            };
            let path = Path::new(path);
            if !path.is_absolute() {
                return Err(format!("`{s}`: the path must be absolute"));
            }
            if tag
                .as_deref()
                .is_some_and(|t| t.is_empty() || t.len() > 128)
            {
                return Err(format!("`{s}`: an empty or overlong tag"));
            }
            Ok((path.to_owned(), tag))
        };
        if let Some(rest) = s.strip_prefix("oci-archive:") {
            let (file, tag) = local(rest)?;
            return Ok(ImageSource::Archive { file, tag });
        }
        if let Some(rest) = s.strip_prefix("oci:") {
            let (dir, tag) = local(rest)?;
            return Ok(ImageSource::Layout { dir, tag });
        }
        let r = oci_client::Reference::try_from(s).map_err(|e| format!("`{s}`: {e}"))?;
        Ok(ImageSource::Registry {
            reference: r.whole(),
            registry: r.registry().to_owned(),
        })
    }

    /// The registry pulled from, for a registry reference.
    pub fn registry(&self) -> Option<&str> {
        match self {
            ImageSource::Registry { registry, .. } => Some(registry),
            _ => None,
        }
    }
}

impl std::fmt::Display for ImageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tagged = |f: &mut std::fmt::Formatter<'_>, kind: &str, p: &Path, t: &Option<String>| {
            write!(f, "{kind}:{}", p.display())?;
            match t {
                Some(t) => write!(f, ":{t}"),
                None => Ok(()),
            }
        };
        match self {
            ImageSource::Registry { reference, .. } => f.write_str(reference),
            ImageSource::Layout { dir, tag } => tagged(f, "oci", dir, tag),
            ImageSource::Archive { file, tag } => tagged(f, "oci-archive", file, tag),
        }
    }
}

/// An image a tenant's sessions may choose: one source, or every registry
/// reference that starts with a prefix (`registry/team/*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImagePattern {
    Exact(ImageSource),
    Prefix(String),
}

impl ImagePattern {
    pub fn parse(s: &str) -> Result<ImagePattern, String> {
        match s.strip_suffix('*') {
            Some(prefix) => {
                // At least `registry/`: a pattern never spans registries.
                if !prefix.contains('/') || prefix.contains('*') || prefix.starts_with("oci") {
                    return Err(format!(
                        "`{s}`: a pattern is a registry reference prefix with its registry and a `/`, then `*`"
                    ));
                }
                Ok(ImagePattern::Prefix(prefix.to_owned()))
            }
            None => ImageSource::parse(s).map(ImagePattern::Exact),
        }
    }

    /// Whether `source` is among what this pattern allows.
    pub fn allows(&self, source: &ImageSource) -> bool {
        match (self, source) {
            (ImagePattern::Exact(s), _) => s == source,
            (ImagePattern::Prefix(p), ImageSource::Registry { reference, .. }) => {
                reference.starts_with(p.as_str())
            }
            (ImagePattern::Prefix(_), _) => false,
        }
    }

    /// The registry a pattern pulls from.
    pub fn registry(&self) -> Option<&str> {
        match self {
            ImagePattern::Exact(s) => s.registry(),
            ImagePattern::Prefix(p) => p.split('/').next(),
        }
    }
}

/// A tenant's images pull only from allowed registries.
pub(super) fn check_tenant(
    what: &str,
    image: Option<&ImageSource>,
    allowed: &[ImagePattern],
    images: &ImagesSettings,
) -> Result<(), ConfigError> {
    let registries = image
        .into_iter()
        .filter_map(ImageSource::registry)
        .chain(allowed.iter().filter_map(ImagePattern::registry));
    for r in registries {
        if !images.allows(r) {
            return Err(ConfigError(format!(
                "{what}: images from `{r}` need it in [images] registries"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ImagesSettings, ConfigError> {
        let c: ImagesConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        c.validate()
    }

    #[test]
    fn references_parse_into_their_sources() {
        let r = ImageSource::parse("127.0.0.1:5000/team/py:3.13").unwrap();
        assert_eq!(r.registry(), Some("127.0.0.1:5000"));
        assert_eq!(r.to_string(), "127.0.0.1:5000/team/py:3.13");
        assert_eq!(
            ImageSource::parse("oci:/srv/img:v1").unwrap(),
            ImageSource::Layout {
                dir: "/srv/img".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            ImageSource::parse("oci-archive:/a/b.tar").unwrap(),
            ImageSource::Archive {
                file: "/a/b.tar".into(),
                tag: None
            }
        );
        for bad in ["oci:rel", "", "x@sha256:zz", "r/x:\u{7}"] {
            assert!(ImageSource::parse(bad).is_err(), "{bad}");
        }
        let p = ImagePattern::parse("r:5000/team/*").unwrap();
        assert!(p.allows(&ImageSource::parse("r:5000/team/a:1").unwrap()));
        assert!(!p.allows(&ImageSource::parse("r:5000/other/a:1").unwrap()));
        assert!(ImagePattern::parse("*").is_err());
        assert!(ImagePattern::parse("oci:/x*").is_err());
    }

    #[test]
    fn defaults_pull_from_nowhere() {
        let s = parse("store = \"/s\"").unwrap();
        assert!(s.registries.is_empty());
        assert!(!s.allows("docker.io"));
        assert_eq!(s.max_store_bytes, DEFAULT_MAX_STORE_BYTES);
        assert_eq!(s.max_tenant_bytes, DEFAULT_MAX_TENANT_BYTES);
    }

    /// Guards the tenant's share: unset, half the store and at least one
    /// image; set, between one image and the whole store.
    #[test]
    fn a_tenants_share_holds_one_image_and_no_more_than_the_store() {
        let s = parse("max_store_bytes = 10485760\nmax_image_bytes = 1048576").unwrap();
        assert_eq!(s.max_tenant_bytes, 5 << 20);
        let s = parse("max_store_bytes = 10485760\nmax_image_bytes = 8388608").unwrap();
        assert_eq!(s.max_tenant_bytes, 8 << 20);
        let s = parse("max_image_bytes = 1048576\nmax_tenant_bytes = 3145728").unwrap();
        assert_eq!(s.max_tenant_bytes, 3 << 20);
        for (text, needle) in [
            (
                "max_image_bytes = 2097152\nmax_tenant_bytes = 1048576",
                "max_tenant_bytes is smaller than images.max_image_bytes",
            ),
            (
                "max_store_bytes = 2097152\nmax_image_bytes = 1048576\nmax_tenant_bytes = 4194304",
                "max_tenant_bytes is larger than images.max_store_bytes",
            ),
        ] {
            let e = parse(text).unwrap_err().0;
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn unsafe_or_malformed_settings_are_refused() {
        for (text, needle) in [
            ("registries = [\"https://r\"]", "not a registry name"),
            (
                "insecure_registries = [\"r:5000\"]",
                "not in images.registries",
            ),
            (
                "registries = [\"r:5000\"]\ninsecure_registries = [\"r:5000\"]\n\
                 [credentials.\"r:5000\"]\nusername = \"u\"\npassword_file = \"/p\"",
                "never sent to an insecure",
            ),
            (
                "[credentials.\"r\"]\nusername = \"u\"\npassword_file = \"/p\"",
                "not in images.registries",
            ),
            ("max_layers = 65", "max_layers"),
            (
                "max_store_bytes = 1048576\nmax_image_bytes = 2097152",
                "larger",
            ),
            ("store = \"rel\"", "not absolute"),
        ] {
            let e = parse(text).unwrap_err().0;
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
