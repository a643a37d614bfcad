//! Copying files and directory trees between this machine and a tenant's
//! root, as `cp -r` and `docker cp` do: a destination that is an existing
//! directory receives the source under its own name; otherwise the
//! destination is the copy's name. Regular files and directories are
//! copied; symbolic links and special files are skipped and counted.

use std::path::{Path, PathBuf};

use super::{Client, ClientError, Result};

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

/// Copy `local` (a file or a directory tree) to `remote`.
pub async fn upload(client: &Client, local: &Path, remote: &str) -> Result<CopyStats> {
    let meta = std::fs::metadata(local)
        .map_err(|e| ClientError::Usage(format!("{}: {e}", local.display())))?;
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
    if !meta.is_dir() {
        let mut f = tokio::fs::File::open(local).await?;
        stats.bytes += client.write_file_from(&target, &mut f).await?;
        stats.files += 1;
        return Ok(stats);
    }
    let mut stack: Vec<(PathBuf, String)> = vec![(local.to_path_buf(), target)];
    while let Some((dir, rdir)) = stack.pop() {
        client.create_directory(&rdir, true).await?;
        stats.directories += 1;
        let mut entries = std::fs::read_dir(&dir)?.collect::<std::io::Result<Vec<_>>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                stats.skipped += 1;
                continue;
            };
            let ft = e.file_type()?;
            let rpath = join(&rdir, &name);
            if ft.is_dir() {
                stack.push((e.path(), rpath));
            } else if ft.is_file() {
                let mut f = tokio::fs::File::open(e.path()).await?;
                stats.bytes += client.write_file_from(&rpath, &mut f).await?;
                stats.files += 1;
            } else {
                stats.skipped += 1;
            }
        }
    }
    Ok(stats)
}

/// Copy `remote` (a file or a directory tree) to `local`.
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
    let mut stack: Vec<(String, PathBuf)> = vec![(remote, target)];
    while let Some((rdir, dir)) = stack.pop() {
        std::fs::create_dir_all(&dir)?;
        stats.directories += 1;
        let mut entries = client.read_directory(&rdir).await?;
        entries.sort_by(|a, b| a.file_name.cmp(&b.file_name));
        for e in entries {
            // Names are the gateway's: never a path of their own.
            if e.file_name.is_empty()
                || e.file_name.contains('/')
                || e.file_name == "."
                || e.file_name == ".."
            {
                stats.skipped += 1;
                continue;
            }
            let rpath = join(&rdir, &e.file_name);
            let lpath = dir.join(&e.file_name);
            if e.is_directory {
                stack.push((rpath, lpath));
            } else if e.is_file {
                stats.bytes += fetch(client, &rpath, &lpath).await?;
                stats.files += 1;
            } else {
                stats.skipped += 1;
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
