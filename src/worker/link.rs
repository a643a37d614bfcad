//! The link between the gateway and one worker: a `SOCK_SEQPACKET`
//! socketpair carrying one JSON message per packet, with file descriptors
//! (a child's pipes or PTY master, an opened file) passed by `SCM_RIGHTS`.
//! Every message is a typed enum; nothing is matched on strings.

#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::fs::{FsDone, FsError, FsOp};
use crate::protocol::fs::{MetadataResponse, ReadDirectoryResponse, WalkResponse};
use crate::spawn::{Ended, SpawnSpec};

/// Largest message on the link (the argv and env of one spawn).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// The fd the worker finds its end of the link on.
pub const WORKER_FD: RawFd = 3;
/// Most fds one message carries (stdout, stderr, stdin).
const MAX_FDS: usize = 4;

/// Gateway → worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    Spawn { id: u64, spec: SpawnSpec },
    Fs { id: u64, op: FsOp },
}

/// Worker → gateway.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromWorker {
    /// fds: the child's streams (`ChildFds` order).
    Spawned { id: u64, pid: i32 },
    SpawnFailed {
        id: u64,
        errno: Option<i32>,
        message: String,
    },
    /// A child the worker spawned ended (and was reaped).
    Exited { pid: i32, ended: Ended },
    /// fds: the opened file when the reply is [`FsReply::File`].
    FsDone {
        id: u64,
        result: Result<FsReply, FsError>,
    },
}

/// [`FsDone`] on the wire: the file itself travels as an fd.
#[derive(Debug, Serialize, Deserialize)]
pub enum FsReply {
    Done,
    Metadata(MetadataResponse),
    Directory(ReadDirectoryResponse),
    File,
    Path(String),
    Walk(WalkResponse),
    Exist(Vec<bool>),
}

impl FsReply {
    /// Split a result for sending: the message and the fd to pass.
    pub fn split(done: FsDone) -> (FsReply, Option<OwnedFd>) {
        match done {
            FsDone::Done => (FsReply::Done, None),
            FsDone::Metadata(m) => (FsReply::Metadata(m), None),
            FsDone::Directory(d) => (FsReply::Directory(d), None),
            FsDone::File(f) => (FsReply::File, Some(OwnedFd::from(f))),
            FsDone::Path(p) => (FsReply::Path(p), None),
            FsDone::Walk(w) => (FsReply::Walk(w), None),
            FsDone::Exist(e) => (FsReply::Exist(e), None),
        }
    }

    /// Join a received reply with the fds that came with it.
    pub fn join(self, fds: Vec<OwnedFd>) -> Result<FsDone, FsError> {
        Ok(match self {
            FsReply::Done => FsDone::Done,
            FsReply::Metadata(m) => FsDone::Metadata(m),
            FsReply::Directory(d) => FsDone::Directory(d),
            FsReply::Path(p) => FsDone::Path(p),
            FsReply::Walk(w) => FsDone::Walk(w),
            FsReply::Exist(e) => FsDone::Exist(e),
            FsReply::File => {
                FsDone::File(std::fs::File::from(fds.into_iter().next().ok_or_else(
                    || FsError::Io("worker: no file came back".to_owned()),
                )?))
            }
        })
    }
}

/// A connected pair: ours (close-on-exec) and the worker's.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    // A packet must fit the sender's buffer whole; the default (~208 KiB)
    // is smaller than a large directory listing.
    for fd in [&a, &b] {
        size_buffers(fd);
    }
    Ok((a, b))
}

/// Make room for a [`MAX_MESSAGE_BYTES`] packet: forced when privileged,
/// else as far as `net.core.wmem_max` allows (a larger reply then fails to
/// send and the worker answers with an error instead).
fn size_buffers(fd: &OwnedFd) {
    let want = libc::c_int::try_from(MAX_MESSAGE_BYTES + 64 * 1024).unwrap_or(libc::c_int::MAX);
    for (force, plain) in [
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
    ] {
        let set = |opt| {
            // SAFETY: a valid socket and a pointer to a c_int of the given length.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const want).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        if set(force) != 0 {
            let _ = set(plain);
        }
    }
}

/// Send one message with `fds` attached.
pub fn send<T: Serialize>(sock: &OwnedFd, msg: &T, fds: &[RawFd]) -> io::Result<()> {
    let data = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if data.len() > MAX_MESSAGE_BYTES {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let iov = [IoSlice::new(&data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map(|_| ())
        .map_err(io::Error::from)
}

/// What [`recv`] read.
pub enum Received<T> {
    Message(T, Vec<OwnedFd>),
    /// A packet that did not decode (its fds are closed).
    Malformed,
    /// The other end closed the link.
    Eof,
}

/// Receive one message into `buf` (at least [`MAX_MESSAGE_BYTES`]).
pub fn recv<T: DeserializeOwned>(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<Received<T>> {
    recv_with(sock.as_raw_fd(), buf, MsgFlags::empty())
}

/// [`recv`] that never blocks: `WouldBlock` when nothing is queued (for a
/// link read from the runtime's reactor).
pub fn try_recv<T: DeserializeOwned>(sock: RawFd, buf: &mut [u8]) -> io::Result<Received<T>> {
    recv_with(sock, buf, MsgFlags::MSG_DONTWAIT)
}

fn recv_with<T: DeserializeOwned>(
    sock: RawFd,
    buf: &mut [u8],
    flags: MsgFlags,
) -> io::Result<Received<T>> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (bytes, fds) = {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = loop {
            match recvmsg::<()>(
                sock,
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC | flags,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r.map_err(io::Error::from)?,
            }
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these fds in this process.
                fds.extend(raw.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
            }
        }
        (msg.bytes, fds)
    };
    if bytes == 0 {
        return Ok(Received::Eof);
    }
    Ok(match serde_json::from_slice(&buf[..bytes]) {
        Ok(m) => Received::Message(m, fds),
        Err(_) => Received::Malformed,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn messages_and_fds_cross_the_link_typed() {
        let (a, b) = pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        let (reply, fd) = FsReply::split(FsDone::File(file));
        let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        let msg = FromWorker::FsDone {
            id: 9,
            result: Ok(reply),
        };
        send(&a, &msg, &raw).unwrap();
        let err = FromWorker::FsDone {
            id: 10,
            result: Err(FsError::NotFound("gone".into())),
        };
        send(&a, &err, &[]).unwrap();
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let Received::Message(FromWorker::FsDone { id, result }, fds) =
            recv::<FromWorker>(&b, &mut buf).unwrap()
        else {
            panic!("expected FsDone")
        };
        assert_eq!(id, 9);
        assert!(matches!(
            result.unwrap().join(fds).unwrap(),
            FsDone::File(_)
        ));
        let Received::Message(FromWorker::FsDone { result, .. }, _) =
            recv::<FromWorker>(&b, &mut buf).unwrap()
        else {
            panic!("expected FsDone")
        };
        assert_eq!(result.unwrap_err(), FsError::NotFound("gone".into()));
        drop(a);
        assert!(matches!(
            recv::<FromWorker>(&b, &mut buf).unwrap(),
            Received::Eof
        ));
    }

    #[test]
    fn oversized_and_malformed_messages_are_refused() {
        let (a, b) = pair().unwrap();
        let spec = SpawnSpec {
            argv: vec!["x".repeat(MAX_MESSAGE_BYTES)],
            cwd: "/".into(),
            env: Default::default(),
            arg0: None,
            tty: false,
            pipe_stdin: false,
            fallback_path: None,
            cgroups: Vec::new(),
            cgroup_dir: None,
        };
        let e = send(&a, &ToWorker::Spawn { id: 1, spec }, &[]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::E2BIG));
        send(&a, &"not a message", &[]).unwrap();
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        assert!(matches!(
            recv::<ToWorker>(&b, &mut buf).unwrap(),
            Received::Malformed
        ));
    }
}
