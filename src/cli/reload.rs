//! Live reload: SIGHUP, or a change to the configuration's files (a
//! Kubernetes ConfigMap or Secret update), re-reads the configuration and
//! hands it to [`Gateway::reload`].

use std::path::PathBuf;

use crate::config::{ConfigError, Settings};
use crate::gateway::Gateway;

/// Re-reads `serve`'s settings (SIGHUP).
pub(super) type Reread = Box<dyn Fn() -> Result<Settings, ConfigError> + Send + Sync>;

/// How often the configuration file (and the key files it names) are
/// checked for changes: a Kubernetes ConfigMap or Secret update lands in
/// the mounted files within the kubelet's sync period, and is reloaded
/// by the next check.
pub const CONFIG_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// What the configuration's files hold now (the file itself, every
/// secret file it names): a change is a reason to reload.
fn config_fingerprint(config: Option<&std::path::Path>, secrets: &[PathBuf]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in config
        .into_iter()
        .chain(secrets.iter().map(PathBuf::as_path))
    {
        bounded_read(p).hash(&mut h);
    }
    h.finish()
}

/// Largest file read whole for the fingerprint; a larger one counts by
/// size and modification time.
const MAX_FINGERPRINT_READ: u64 = 1024 * 1024;

/// A file's bytes for the fingerprint, without waiting or growing without
/// bound: opened non-blocking (a FIFO in a key's place would block the
/// open for ever), regular files only (`/dev/zero` never ends).
fn bounded_read(p: &std::path::Path) -> Option<(Vec<u8>, u64, Option<std::time::SystemTime>)> {
    use std::io::Read as _;
    let (f, meta) = crate::fs::open_regular(p).ok()?;
    let (len, modified) = (meta.len(), meta.modified().ok());
    if len > MAX_FINGERPRINT_READ {
        return Some((Vec::new(), len, modified));
    }
    let mut buf = Vec::new();
    f.take(MAX_FINGERPRINT_READ).read_to_end(&mut buf).ok()?;
    Some((buf, len, modified))
}

/// Reload the configuration on every SIGHUP, and when its files change
/// (checked every [`CONFIG_POLL_INTERVAL`]): the new tenants and keys
/// apply, or, if the new file is refused, one line says why and the
/// running configuration stays (the same files are not tried again until
/// they change).
///
/// The SIGHUP handler is installed here, before the returned task first
/// runs: the caller installs it before anything says the gateway is up,
/// so a SIGHUP sent right after the start reloads rather than (the
/// signal's default) ending the process.
pub(super) fn reload_on_change(
    gw: std::sync::Arc<Gateway>,
    reread: Reread,
    config: Option<PathBuf>,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(hup) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler; configuration reload is off");
        return None;
    };
    Some(reload_loop(gw, reread, config, hup))
}

async fn reload_loop(
    gw: std::sync::Arc<Gateway>,
    reread: Reread,
    config: Option<PathBuf>,
    mut hup: tokio::signal::unix::Signal,
) {
    let reread = std::sync::Arc::new(reread);
    let watched = |s: &crate::config::Settings| -> Vec<PathBuf> {
        let mut v = s.secret_files.clone();
        v.retain(|p| !s.audit_files.contains(p));
        v
    };
    let mut secrets = watched(&gw.settings);
    let mut seen = config_fingerprint(config.as_deref(), &secrets);
    let mut poll = tokio::time::interval(CONFIG_POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let why = tokio::select! {
            s = hup.recv() => match s {
                Some(()) => {
                    seen = config_fingerprint(config.as_deref(), &secrets);
                    "SIGHUP"
                }
                None => return,
            },
            _ = poll.tick() => {
                if config.is_none() {
                    continue;
                }
                let now = config_fingerprint(config.as_deref(), &secrets);
                if now == seen {
                    continue;
                }
                // These files are tried once, reloaded or refused.
                seen = now;
                "the configuration's files changed"
            }
        };
        let r = reread.clone();
        let result = match tokio::task::spawn_blocking(move || r()).await {
            Ok(Ok(new)) => gw.reload(&new).map(|s| (s, watched(&new))),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(ConfigError(format!("reload: {e}"))),
        };
        let outcome = match result {
            Ok((summary, files)) => {
                tracing::info!(trigger = why, "configuration reloaded: {summary}");
                secrets = files;
                seen = config_fingerprint(config.as_deref(), &secrets);
                super::release_freed_memory();
                "ok"
            }
            Err(e) => {
                tracing::error!(
                    trigger = why,
                    "configuration reload refused, the running configuration stays: {e}"
                );
                "refused"
            }
        };
        gw.metrics
            .config_reloads
            .get_or_create(&crate::metrics::OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// A FIFO or a device in a watched file's place neither blocks nor
    /// grows the fingerprint's read (it counts as unreadable).
    #[test]
    fn a_fifo_or_a_device_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("key");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(super::bounded_read(&fifo).is_none());
        assert!(super::bounded_read(std::path::Path::new("/dev/zero")).is_none());
        let big = dir.path().join("big");
        std::fs::write(&big, vec![0u8; 2 * 1024 * 1024]).unwrap();
        let (bytes, len, _) = super::bounded_read(&big).unwrap();
        assert!(bytes.is_empty());
        assert_eq!(len, 2 * 1024 * 1024);
    }
}
