//! Starting a worker whose `/` is an image. The worker is this binary, and
//! its mount namespace has already made the image `/` when it is exec'd
//! (the pivot happens before the sandbox drops the capabilities it
//! needs): a dynamically linked binary would look for its loader and
//! libraries in the image. So the host's loader is exec'd through a
//! descriptor, given the host's library directories and the binary as
//! descriptors too (`/proc/self/fd/N`, magic links that reach the host's
//! files from any root); the worker closes them once it runs.

use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::fd::{AsRawFd as _, RawFd};
use std::path::{Path, PathBuf};

/// The host's loader and library directories, opened once.
pub struct HostLoader {
    /// `None`: the binary is static and needs no loader.
    loader: Option<File>,
    libdirs: Vec<File>,
    /// The host paths of `libdirs` (the loader's is among them).
    dirs: Vec<PathBuf>,
}

impl HostLoader {
    /// The loader (`None` for a static binary).
    pub fn loader_fd(&self) -> Option<RawFd> {
        self.loader.as_ref().map(|f| f.as_raw_fd())
    }

    /// Descriptors the worker inherits and closes once it runs.
    pub fn inherited(&self) -> Vec<RawFd> {
        self.libdirs.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// `--library-path` for the loader.
    /// The host directories the loader maps the worker's libraries from:
    /// all a worker under an image needs of the host's system directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    pub fn library_path(&self) -> String {
        self.libdirs
            .iter()
            .map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()))
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// This process's loader and library directories (read once).
pub fn host_loader() -> io::Result<&'static HostLoader> {
    static LOADER: std::sync::OnceLock<Result<HostLoader, String>> = std::sync::OnceLock::new();
    LOADER
        .get_or_init(|| find().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| io::Error::other(e.clone()))
}

fn find() -> io::Result<HostLoader> {
    let loader = interpreter(Path::new("/proc/self/exe"))?
        .map(File::open)
        .transpose()?;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut dirs: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains(".so"))
        .filter_map(|p| Path::new(p).parent().map(Path::to_path_buf))
        .collect();
    dirs.sort();
    dirs.dedup();
    let libdirs = dirs
        .iter()
        .map(|d| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(d)
        })
        .collect::<io::Result<Vec<_>>>()?;
    Ok(HostLoader {
        loader,
        libdirs,
        dirs,
    })
}

use std::os::unix::fs::OpenOptionsExt as _;

/// The `PT_INTERP` path of a 64-bit little-endian ELF file, if it has one.
fn interpreter(exe: &Path) -> io::Result<Option<PathBuf>> {
    let mut f = File::open(exe)?;
    let mut h = [0u8; 64];
    f.read_exact(&mut h)?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Err(io::Error::other("not a 64-bit little-endian ELF file"));
    }
    let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
    let mut u64b = [0u8; 8];
    u64b.copy_from_slice(&h[0x20..0x28]);
    let phoff = u64::from_le_bytes(u64b);
    let (phentsize, phnum) = (u64::from(u16_at(0x36)), u64::from(u16_at(0x38)));
    for i in 0..phnum.min(256) {
        let mut ph = [0u8; 56];
        f.seek(SeekFrom::Start(phoff + i * phentsize))?;
        f.read_exact(&mut ph)?;
        if u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) != 3 {
            continue; // not PT_INTERP
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&ph[8..16]);
        let offset = u64::from_le_bytes(b);
        b.copy_from_slice(&ph[32..40]);
        let size = u64::from_le_bytes(b).min(4096);
        let mut path = vec![0u8; usize::try_from(size).unwrap_or(0)];
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(&mut path)?;
        let end = path.iter().position(|&c| c == 0).unwrap_or(path.len());
        use std::os::unix::ffi::OsStrExt as _;
        return Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(
            &path[..end],
        ))));
    }
    Ok(None)
}

/// The command that starts a worker: this binary through `exe` (a held
/// descriptor, when there is one), or, under an image, through the
/// host's loader; what the worker must inherit goes into `inherit`.
pub fn worker_command(
    exe: Option<RawFd>,
    arg0: &Path,
    image: bool,
    inherit: &mut Vec<RawFd>,
) -> io::Result<std::process::Command> {
    use std::os::unix::process::CommandExt as _;
    let direct = |fd: RawFd| {
        let mut c = std::process::Command::new(format!("/proc/self/fd/{fd}"));
        c.arg0(arg0);
        c
    };
    Ok(match (exe, image) {
        (Some(exe), true) => {
            let host = host_loader()?;
            inherit.push(exe);
            inherit.extend(host.inherited());
            match host.loader_fd() {
                Some(ld) => {
                    let mut c = direct(ld);
                    c.arg("--argv0")
                        .arg(arg0)
                        .arg("--library-path")
                        .arg(host.library_path())
                        .arg(format!("/proc/self/fd/{exe}"));
                    c
                }
                None => direct(exe),
            }
        }
        (None, true) => {
            return Err(io::Error::other(
                "a worker under an image needs the gateway's own executable held open",
            ));
        }
        (Some(fd), false) => direct(fd),
        (None, false) => std::process::Command::new(arg0),
    })
}
