//! Copying files and directory trees between this machine and a tenant's
//! root, as `cp -r` and `docker cp` do: a destination that is an existing
//! directory receives the source under its own name; otherwise the
//! destination is the copy's name. Regular files and directories are
//! copied; symbolic links and special files are skipped and counted.

use std::path::Path;

use super::common::Backoff;
use super::error::is_overloaded;
use super::{Client, ClientError, DEFAULT_RESUME_WITHIN, Result};

/// What a copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    pub files: u64,
    pub directories: u64,
    pub bytes: u64,
    /// Symbolic links and special files left out.
    pub skipped: u64,
}

fn base_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// Deepest directory level copied; deeper trees are refused.
pub const MAX_DEPTH: usize = 256;

/// Most entries (files and directories) one copy lists.
pub const MAX_ENTRIES: usize = 1_000_000;

/// One entry of a listed tree, relative to its top.
enum Entry {
    Dir(String),
    File(String),
}

fn too_big(what: &str) -> ClientError {
    ClientError::Usage(format!(
        "{what}: more than {MAX_ENTRIES} entries or {MAX_DEPTH} levels; copy it in parts"
    ))
}

fn rel_join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        format!("{rel}/{name}")
    }
}

/// Copy `local` (a file or a directory tree) to `remote`. The tree is
/// listed before anything is written, so a destination inside the source
/// is not copied into itself.
pub async fn upload(client: &Client, local: &Path, remote: &str) -> Result<CopyStats> {
    let meta = std::fs::metadata(local)
        .map_err(|e| ClientError::Usage(format!("{}: {e}", local.display())))?;
    if !meta.is_dir() && !meta.is_file() {
        return Err(ClientError::Usage(format!(
            "{}: not a regular file or directory",
            local.display()
        )));
    }
    let remote = client.absolute(remote);
    let target = match client.metadata(&remote).await {
        Ok(m) if m.is_directory => {
            let name = local
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| ClientError::Usage(format!("{}: no file name", local.display())))?;
            join(&remote, name)
        }
        Ok(_) => remote,
        Err(e) if e.is_not_found() => remote,
        Err(e) => return Err(e),
    };
    let mut stats = CopyStats::default();
    if meta.is_file() {
        stats.bytes += upload_file(client, local, &target).await?;
        stats.files += 1;
        return Ok(stats);
    }
    // List first (symbolic links and special files left out).
    let mut entries = vec![Entry::Dir(String::new())];
    let mut queue = vec![(String::new(), 0usize)];
    while let Some((rel, depth)) = queue.pop() {
        let dir = local.join(&rel);
        let mut listed = std::fs::read_dir(&dir)?.collect::<std::io::Result<Vec<_>>>()?;
        listed.sort_by_key(|e| e.file_name());
        for e in listed {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                stats.skipped += 1;
                continue;
            };
            let ft = e.file_type()?;
            let child = rel_join(&rel, &name);
            if ft.is_dir() {
                if depth + 1 > MAX_DEPTH {
                    return Err(too_big(&local.display().to_string()));
                }
                entries.push(Entry::Dir(child.clone()));
                queue.push((child, depth + 1));
            } else if ft.is_file() {
                entries.push(Entry::File(child));
            } else {
                stats.skipped += 1;
            }
            if entries.len() > MAX_ENTRIES {
                return Err(too_big(&local.display().to_string()));
            }
        }
    }
    for e in entries {
        match e {
            Entry::Dir(rel) => {
                let r = if rel.is_empty() {
                    target.clone()
                } else {
                    join(&target, &rel)
                };
                client.create_directory(&r, true).await?;
                stats.directories += 1;
            }
            Entry::File(rel) => {
                stats.bytes += upload_file(client, &local.join(&rel), &join(&target, &rel)).await?;
                stats.files += 1;
            }
        }
    }
    Ok(stats)
}

/// One local file to the gateway; a refusal for load is retried.
async fn upload_file(client: &Client, local: &Path, remote: &str) -> Result<u64> {
    let mut backoff = Backoff::new(DEFAULT_RESUME_WITHIN);
    loop {
        let mut f = tokio::fs::File::open(local).await?;
        match client.write_file_from(remote, &mut f).await {
            Err(e) if is_overloaded(&e) && backoff.wait().await => {}
            r => return r,
        }
    }
}

/// Copy `remote` (a file or a directory tree) to `local`. The tree is
/// listed before anything is written; symbolic links in it are skipped
/// (a link to `.` would otherwise be copied without end).
pub async fn download(client: &Client, remote: &str, local: &Path) -> Result<CopyStats> {
    let remote = client.absolute(remote);
    let meta = client.metadata(&remote).await?;
    let target = match std::fs::metadata(local) {
        Ok(m) if m.is_dir() => {
            let name = base_name(&remote)
                .ok_or_else(|| ClientError::Usage(format!("{remote}: no file name")))?;
            local.join(name)
        }
        _ => local.to_path_buf(),
    };
    let mut stats = CopyStats::default();
    if !meta.is_directory {
        if !meta.is_file {
            return Err(ClientError::Usage(format!(
                "{remote} is not a regular file"
            )));
        }
        stats.bytes += fetch(client, &remote, &target).await?;
        stats.files += 1;
        return Ok(stats);
    }
    let mut entries = vec![Entry::Dir(String::new())];
    let mut queue = vec![(String::new(), 0usize)];
    while let Some((rel, depth)) = queue.pop() {
        let rdir = if rel.is_empty() {
            remote.clone()
        } else {
            join(&remote, &rel)
        };
        let mut listed = client.read_directory(&rdir).await?;
        listed.sort_by(|a, b| a.file_name.cmp(&b.file_name));
        for e in listed {
            // Names are the gateway's: never a path of their own.
            if e.file_name.is_empty()
                || e.file_name.contains('/')
                || e.file_name == "."
                || e.file_name == ".."
                || !(e.is_directory || e.is_file)
            {
                stats.skipped += 1;
                continue;
            }
            let child = rel_join(&rel, &e.file_name);
            // Listings follow links; a link is found by asking.
            if client.metadata(&join(&remote, &child)).await?.is_symlink {
                stats.skipped += 1;
                continue;
            }
            if e.is_directory {
                if depth + 1 > MAX_DEPTH {
                    return Err(too_big(&remote));
                }
                entries.push(Entry::Dir(child.clone()));
                queue.push((child, depth + 1));
            } else {
                entries.push(Entry::File(child));
            }
            if entries.len() > MAX_ENTRIES {
                return Err(too_big(&remote));
            }
        }
    }
    for e in entries {
        match e {
            Entry::Dir(rel) => {
                std::fs::create_dir_all(target.join(&rel))?;
                stats.directories += 1;
            }
            Entry::File(rel) => {
                stats.bytes += fetch(client, &join(&remote, &rel), &target.join(&rel)).await?;
                stats.files += 1;
            }
        }
    }
    Ok(stats)
}

/// One remote file into a local one, replacing it.
async fn fetch(client: &Client, remote: &str, local: &Path) -> Result<u64> {
    let mut f = tokio::fs::File::create(local).await?;
    let n = client.read_file_to(remote, &mut f).await?;
    f.sync_all().await?;
    Ok(n)
}
