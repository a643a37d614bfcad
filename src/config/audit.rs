//! `[audit]`: where the audit trail goes and how large it may grow
//! (module `audit`).

use std::path::PathBuf;

use serde::Deserialize;

use super::common::ConfigError;
pub use crate::audit::{AuditSettings, AuditSink};

/// `[audit]`, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// An absolute file path, or `-` for stdout (after the URLs printed at
    /// start). Default: none (no audit trail).
    pub file: Option<String>,
    /// The file is rotated when it would grow past this. Default 100 MiB.
    pub max_file_bytes: Option<u64>,
    /// Rotated files kept (`FILE.1` newest). Default 5.
    pub max_files: Option<usize>,
    /// Bytes of events waiting for the writer; past it events are dropped
    /// and counted. Default 16 MiB.
    pub queue_bytes: Option<usize>,
    /// Bytes of whole events one tenant may have written a minute; past
    /// it its events are summarised, past twice it left out (counted).
    /// Default 1 MiB.
    pub tenant_bytes_per_minute: Option<u64>,
}

pub const DEFAULT_AUDIT_MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;
pub const DEFAULT_AUDIT_MAX_FILES: usize = 5;
pub const DEFAULT_AUDIT_QUEUE_BYTES: usize = 16 * 1024 * 1024;
/// At the defaults (600 MiB kept), one tenant needs over 5 hours to
/// rotate the others' events away.
pub const DEFAULT_AUDIT_TENANT_BYTES_PER_MINUTE: u64 = 1024 * 1024;
/// Smallest `max_file_bytes`: two of the largest events.
pub const MIN_AUDIT_FILE_BYTES: u64 = 2 * crate::audit::MAX_EVENT_BYTES as u64;
/// Events waiting for the writer, at most.
pub const AUDIT_QUEUE_EVENTS: usize = 65_536;
/// Rotated files kept, at most.
pub const MAX_AUDIT_FILES: usize = 100;

pub(super) fn validate_audit(a: &AuditConfig) -> Result<Option<AuditSettings>, ConfigError> {
    let Some(file) = &a.file else {
        if a.max_file_bytes.is_some()
            || a.max_files.is_some()
            || a.queue_bytes.is_some()
            || a.tenant_bytes_per_minute.is_some()
        {
            return Err(ConfigError(
                "[audit] has settings but no `file` (a path, or `-` for stdout)".to_owned(),
            ));
        }
        return Ok(None);
    };
    let sink = if file == "-" {
        AuditSink::Stdout
    } else {
        let p = PathBuf::from(file);
        if !p.is_absolute() {
            return Err(ConfigError(format!(
                "audit.file `{file}` must be an absolute path (or `-` for stdout)"
            )));
        }
        // The directory as it resolves now (a symlinked parent must not
        // carry the trail into a tenant's root unseen).
        match (p.parent().map(std::fs::canonicalize), p.file_name()) {
            (Some(Ok(dir)), Some(name)) => AuditSink::File(dir.join(name)),
            (Some(Err(e)), _) => {
                return Err(ConfigError(format!(
                    "audit.file `{file}`: its directory: {e}"
                )));
            }
            _ => {
                return Err(ConfigError(format!("audit.file `{file}` must name a file")));
            }
        }
    };
    let max_file_bytes = a.max_file_bytes.unwrap_or(DEFAULT_AUDIT_MAX_FILE_BYTES);
    // Room for the largest event: a file then never grows past it.
    if max_file_bytes < MIN_AUDIT_FILE_BYTES {
        return Err(ConfigError(format!(
            "audit.max_file_bytes must be at least {MIN_AUDIT_FILE_BYTES} (twice the largest event)"
        )));
    }
    let max_files = a.max_files.unwrap_or(DEFAULT_AUDIT_MAX_FILES);
    if max_files > MAX_AUDIT_FILES {
        return Err(ConfigError(format!(
            "audit.max_files must be at most {MAX_AUDIT_FILES}"
        )));
    }
    let queue_bytes = a.queue_bytes.unwrap_or(DEFAULT_AUDIT_QUEUE_BYTES);
    if queue_bytes < 64 * 1024 {
        return Err(ConfigError(
            "audit.queue_bytes must be at least 65536".to_owned(),
        ));
    }
    let tenant_bytes_per_minute = a
        .tenant_bytes_per_minute
        .unwrap_or(DEFAULT_AUDIT_TENANT_BYTES_PER_MINUTE);
    if tenant_bytes_per_minute < crate::audit::MAX_EVENT_BYTES as u64 {
        return Err(ConfigError(format!(
            "audit.tenant_bytes_per_minute must be at least {} (the largest event)",
            crate::audit::MAX_EVENT_BYTES
        )));
    }
    Ok(Some(AuditSettings {
        sink,
        max_file_bytes,
        max_files,
        queue_bytes,
        queue_events: AUDIT_QUEUE_EVENTS,
        tenant_bytes_per_minute,
    }))
}
