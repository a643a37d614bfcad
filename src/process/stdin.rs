//! A process's stdin: a pipe, a PTY, or none.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::AsyncWriteExt as _;
use tokio::net::unix::pipe;

use crate::error::GatewayError;
use crate::spawn::Pty;

pub enum Stdin {
    /// `/dev/null` (no `pipeStdin`), or closed.
    None,
    /// The write end of the stdin pipe; taken (closed) at `closeStdin` and
    /// when the process closes, so a writer sees EOF. `refused` after
    /// `closeStdin` or `terminate`: later writes fail.
    Pipe {
        tx: tokio::sync::Mutex<Option<pipe::Sender>>,
        refused: std::sync::atomic::AtomicBool,
    },
    /// The PTY master, given back when the process closes (a retained
    /// process holds no descriptor); `closed` from then on.
    Pty {
        pty: parking_lot::Mutex<Option<Arc<Pty>>>,
        closed: std::sync::atomic::AtomicBool,
    },
}

impl Stdin {
    pub fn pipe(tx: pipe::Sender) -> Stdin {
        Stdin::Pipe {
            tx: tokio::sync::Mutex::new(Some(tx)),
            refused: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn is_none(&self) -> bool {
        matches!(self, Stdin::None)
    }

    /// `process/terminate`: later writes fail (as the reference's do).
    pub fn refuse(&self) {
        match self {
            Stdin::None => {}
            Stdin::Pipe { refused, .. } => refused.store(true, Ordering::Release),
            Stdin::Pty { closed, .. } => closed.store(true, Ordering::Release),
        }
    }

    /// Write all of `data`.
    pub async fn write(&self, data: &[u8]) -> Result<(), GatewayError> {
        let failed = || GatewayError::Internal("failed to write to process stdin".to_owned());
        match self {
            Stdin::None => Err(failed()),
            Stdin::Pipe { tx, refused } => {
                if refused.load(Ordering::Acquire) {
                    return Err(failed());
                }
                let mut guard = tx.lock().await;
                // The process ended, or closed its stdin (EPIPE): the
                // reference accepts the write and the bytes go nowhere.
                let Some(stdin) = guard.as_mut() else {
                    return Ok(());
                };
                match stdin.write_all(data).await {
                    Ok(()) => stdin.flush().await.map_err(|_| failed()),
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                    Err(_) => Err(failed()),
                }
            }
            Stdin::Pty { pty, closed } => {
                let pty = pty.lock().clone();
                if closed.load(Ordering::Acquire) {
                    return Err(failed());
                }
                match pty {
                    Some(pty) => match pty.write_all(data).await {
                        Ok(()) => Ok(()),
                        // The process ended (its terminal hung up): the
                        // reference accepts the write, as for a pipe.
                        Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(()),
                        Err(_) => Err(failed()),
                    },
                    // Ended and its terminal closed: accepted likewise.
                    None => Ok(()),
                }
            }
        }
    }

    /// `process/closeStdin`: EOF on a pipe; ^D on a PTY.
    pub async fn close(&self) -> Result<(), GatewayError> {
        match self {
            Stdin::None => Ok(()),
            Stdin::Pipe { tx, refused } => {
                refused.store(true, Ordering::Release);
                if let Some(mut s) = tx.lock().await.take() {
                    let _ = s.shutdown().await;
                }
                Ok(())
            }
            Stdin::Pty { .. } => self.write(&[0x04]).await,
        }
    }

    /// The process closed: what is written later goes nowhere (accepted,
    /// as the reference does, for a pipe and a terminal alike).
    pub async fn release(&self) {
        match self {
            Stdin::None => {}
            Stdin::Pipe { tx, .. } => {
                tx.lock().await.take();
            }
            Stdin::Pty { pty, .. } => {
                pty.lock().take();
            }
        }
    }
}
