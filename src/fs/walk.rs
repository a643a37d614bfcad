//! `fs/walk`: a bounded breadth-first listing of a directory tree.

use super::error::{Failed, FsError};
use super::root::FsRoot;
use crate::protocol::fs::{WalkEntry, WalkError, WalkKind, WalkParams, WalkResponse};

/// Most entries a walk returns and directories it reads, whatever a
/// client asks.
pub const MAX_WALK_ENTRIES: u64 = 100_000;

/// `fs/walk`: breadth first, entries sorted by name within a directory,
/// the root's entries at depth 0; directories below `maxDepth` are read,
/// `.hidden` ones listed but not read when pruning, symbolic links to
/// directories listed (and read once per directory) only when following,
/// other symbolic links and special files skipped.
pub(super) fn walk(root: &FsRoot, p: WalkParams) -> Result<WalkResponse, Failed> {
    let o = p.options;
    // A zero depth lists the directory's own entries (as 0.169.0 does).
    if o.max_directories == 0 || o.max_entries == 0 {
        return Err(FsError::InvalidRequest(
            "filesystem walk limits must be greater than zero".to_owned(),
        )
        .into());
    }
    let (max_entries, max_dirs) = (
        o.max_entries.min(MAX_WALK_ENTRIES) as usize,
        o.max_directories.min(MAX_WALK_ENTRIES) as usize,
    );
    let start = root.resolve(p.path.as_str())?;
    let mut out = WalkResponse {
        entries: Vec::new(),
        errors: Vec::new(),
        truncated: false,
    };
    if !start.metadata()?.is_dir() {
        return Ok(out);
    }
    let mut seen = std::collections::HashSet::new();
    if let Ok(m) = start.metadata() {
        seen.insert(m.id());
    }
    let mut queue = std::collections::VecDeque::from([(start, 0u64)]);
    let mut dirs_read = 0usize;
    'walk: while let Some((dir, depth)) = queue.pop_front() {
        if dirs_read >= max_dirs {
            out.truncated = true;
            break;
        }
        dirs_read += 1;
        let mut names = match dir.list() {
            Ok(n) => n,
            Err(e) => {
                out.errors.push(WalkError {
                    path: dir.abs().display().to_string(),
                    message: e.to_string(),
                });
                continue;
            }
        };
        names.sort();
        for name in names {
            let child = dir.join(&name);
            let Ok(lmeta) = child.symlink_metadata() else {
                continue;
            };
            let kind = if lmeta.is_symlink() {
                match child.metadata() {
                    Ok(m) if m.is_dir() && o.follow_directory_symlinks => WalkKind::Directory,
                    _ => continue,
                }
            } else if lmeta.is_dir() {
                WalkKind::Directory
            } else if lmeta.is_file() {
                WalkKind::File
            } else {
                continue;
            };
            if out.entries.len() >= max_entries {
                out.truncated = true;
                break 'walk;
            }
            out.entries.push(WalkEntry {
                path: child.abs().display().to_string(),
                kind,
            });
            let hidden = name.to_string_lossy().starts_with('.');
            if kind == WalkKind::Directory
                && depth < o.max_depth
                && !(hidden && o.prune_hidden_directories)
                && child.metadata().is_ok_and(|m| seen.insert(m.id()))
            {
                queue.push_back((child, depth + 1));
            }
        }
    }
    Ok(out)
}
