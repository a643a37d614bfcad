//! The spool: one file per message and endpoint, written before the
//! message is offered for delivery and removed once it is delivered or
//! given up. What is left at a start is delivered again with the same
//! `webhook-id` (the receiver dedupes by it).
//!
//! `<spool_dir>/<endpoint>/<id>.json`, mode 0600 in directories of mode
//! 0700; written to a `.tmp` name and renamed, so a start never reads half
//! a message. Ids begin with the creation time in hex, so names sort in
//! the order events happened. Not fsynced: a message survives the
//! gateway's crash or restart (the page cache has it), not the host's
//! power loss.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One event for one or more endpoints.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    pub ty: String,
    /// Unix milliseconds when the event happened (a retry's age runs from
    /// it, across restarts).
    pub created_ms: u64,
    pub body: Bytes,
}

#[derive(Serialize)]
struct OnDisk<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    ty: &'a str,
    created_ms: u64,
    body: &'a str,
}

/// [`OnDisk`] as read (its strings have escapes: owned).
#[derive(Deserialize)]
struct Read {
    id: String,
    #[serde(rename = "type")]
    ty: String,
    created_ms: u64,
    body: String,
}

/// Largest spool file read at a start (a message is bounded by
/// `max_event_bytes`, at most [`super::MAX_EVENT_BYTES_LIMIT`]; anything
/// larger is not ours).
const MAX_FILE_BYTES: u64 = 2 * super::MAX_EVENT_BYTES_LIMIT as u64;

/// A new message id: `msg_` + creation milliseconds (12 hex digits) + 16
/// random hex digits: unique, and sorting by time.
pub fn new_id(created_ms: u64) -> String {
    let mut r = [0u8; 8];
    // Without randomness the clock and a counter keep ids unique here.
    if getrandom::fill(&mut r).is_err() {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        r = N
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_be_bytes();
    }
    format!("msg_{created_ms:012x}{:016x}", u64::from_be_bytes(r))
}

/// An id a file may be named by (what [`new_id`] makes).
fn is_id(s: &str) -> bool {
    s.strip_prefix("msg_")
        .is_some_and(|h| h.len() == 28 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Create `dir` (and its parents) with mode 0700 and check it is a
/// directory only its owner can enter.
pub fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    if m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(std::io::Error::other(
            "owned by another user (its messages could be forged)",
        ));
    }
    if m.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Write `m` into `dir`; returns its path.
pub fn write(dir: &Path, m: &Message) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let body = std::str::from_utf8(&m.body).map_err(std::io::Error::other)?;
    let text = serde_json::to_vec(&OnDisk {
        id: &m.id,
        ty: &m.ty,
        created_ms: m.created_ms,
        body,
    })
    .map_err(std::io::Error::other)?;
    let path = dir.join(format!("{}.json", m.id));
    let tmp = dir.join(format!(".{}.tmp", m.id));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    if let Err(e) = f.write_all(&text) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    drop(f);
    std::fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(path)
}

/// The messages left in `dir`, oldest first. Half-written `.tmp` files
/// are removed; a file that is not a message is left alone and logged.
pub fn load(dir: &Path) -> std::io::Result<Vec<(PathBuf, Message)>> {
    let mut names: Vec<String> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(dir.join(&name));
            continue;
        }
        names.push(name);
    }
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let path = dir.join(&name);
        match read_one(&path, &name) {
            Ok(m) => out.push((path, m)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "webhooks: not a spooled message; left alone");
            }
        }
    }
    Ok(out)
}

fn read_one(path: &Path, name: &str) -> Result<Message, String> {
    use std::io::Read as _;
    let id = name
        .strip_suffix(".json")
        .filter(|id| is_id(id))
        .ok_or("not a message's name")?;
    let (f, meta) = open_regular(path)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    let mut text = Vec::new();
    f.take(MAX_FILE_BYTES)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    let d: Read = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if d.id != id || super::event::EVENT_TYPES.iter().all(|t| *t != d.ty) {
        return Err("its id or type is not one of ours".to_owned());
    }
    Ok(Message {
        id: d.id,
        ty: d.ty,
        created_ms: d.created_ms,
        body: Bytes::from(d.body),
    })
}

/// A regular file opened without following a symlink or waiting on a FIFO.
fn open_regular(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    Ok((f, meta))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_written_message_loads_back_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ep");
        make_dir(&d).unwrap();
        let m = |ms: u64, body: &str| Message {
            id: new_id(ms),
            ty: "process.exited".to_owned(),
            created_ms: ms,
            body: Bytes::from(body.to_owned()),
        };
        let (a, b) = (m(2000, r#"{"n":"é\u2028"}"#), m(1000, "{}"));
        write(&d, &a).unwrap();
        write(&d, &b).unwrap();
        std::fs::write(d.join(".half.tmp"), "x").unwrap();
        std::fs::write(d.join("README"), "x").unwrap();
        let got = load(&d).unwrap();
        let ids: Vec<&str> = got.iter().map(|(_, m)| m.id.as_str()).collect();
        assert_eq!(ids, [b.id.as_str(), a.id.as_str()]);
        assert_eq!(got[1].1.body, a.body);
        assert_eq!(got[1].1.created_ms, 2000);
        assert!(!d.join(".half.tmp").exists());
        assert!(d.join("README").exists());
    }
}
