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
        std::fs::read(p).ok().hash(&mut h);
    }
    h.finish()
}

/// Reload the configuration on every SIGHUP, and when its files change
/// (checked every [`CONFIG_POLL_INTERVAL`]): the new tenants and keys
/// apply, or, if the new file is refused, one line says why and the
/// running configuration stays (the same files are not tried again until
/// they change).
pub(super) async fn reload_on_change(
    gw: std::sync::Arc<Gateway>,
    reread: Reread,
    config: Option<PathBuf>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler; configuration reload is off");
        return;
    };
    let reread = std::sync::Arc::new(reread);
    let mut secrets = gw.settings.secret_files.clone();
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
            Ok(Ok(new)) => gw.reload(&new).map(|s| (s, new.secret_files)),
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
