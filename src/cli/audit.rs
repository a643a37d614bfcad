//! `exec-gateway audit`: read the audit trail (module `audit`), oldest
//! first, filtered by tenant, event and age: what a security team asks of
//! it ("what did team T run in the last hour?").

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use super::{CommonArgs, Overrides, settings, usage_error};
use crate::config::{AuditSink, ConfigError};

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The trail's file (default: `[audit] file` of the configuration).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Only this tenant's events.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only events this recent, e.g. `1h`, `15m`.
    #[arg(long)]
    pub since: Option<String>,
    /// Only events of this name, or starting with it and a dot
    /// (`process` matches `process.started` and `process.exited`).
    #[arg(long)]
    pub event: Option<String>,
}

pub(super) fn audit(args: &AuditArgs) -> ExitCode {
    let file = match &args.file {
        Some(f) => f.clone(),
        None => match settings(&args.common, Overrides::default()) {
            Ok(s) => match s.audit.map(|a| a.sink) {
                Some(AuditSink::File(f)) => f,
                _ => {
                    return usage_error(&ConfigError(
                        "the configuration writes no audit file: pass --file".to_owned(),
                    ));
                }
            },
            Err(e) => return usage_error(&e),
        },
    };
    let since = match args.since.as_deref().map(humantime::parse_duration) {
        None => None,
        Some(Ok(d)) => Some(SystemTime::now() - d.min(Duration::from_secs(100 * 365 * 86_400))),
        Some(Err(e)) => return usage_error(&ConfigError(format!("--since: {e}"))),
    };
    let mut out = std::io::stdout().lock();
    for path in crate::audit::files_oldest_first(&file) {
        // Regular files only, opened without waiting (a FIFO put among
        // the rotations must not hang the reader).
        let Ok((f, _)) = crate::fs::open_regular(&path) else {
            continue;
        };
        for line in std::io::BufReader::new(f).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(t) = &args.tenant
                && v["tenant"].as_str() != Some(t.as_str())
            {
                continue;
            }
            if let Some(e) = &args.event {
                let name = v["event"].as_str().unwrap_or_default();
                if !(name == e
                    || name
                        .strip_prefix(e.as_str())
                        .is_some_and(|r| r.starts_with('.')))
                {
                    continue;
                }
            }
            if let Some(since) = since {
                let at = v["ts"]
                    .as_str()
                    .and_then(|t| humantime::parse_rfc3339(t).ok());
                if at.is_none_or(|at| at < since) {
                    continue;
                }
            }
            if writeln!(out, "{line}").is_err() {
                return ExitCode::SUCCESS;
            }
        }
    }
    ExitCode::SUCCESS
}
