//! A process's stdin: a pipe, a PTY, or none.

use std::sync::Arc;

use tokio::io::AsyncWriteExt as _;
use tokio::net::unix::pipe;

use crate::error::GatewayError;
use crate::spawn::Pty;

pub enum Stdin {
    /// `/dev/null` (no `pipeStdin`), or closed.
    None,
    /// The write end of the stdin pipe; taken (closed) at `closeStdin` and
    /// when the process closes, so a writer sees EOF.
    Pipe(tokio::sync::Mutex<Option<pipe::Sender>>),
    /// The PTY master; `closed` after the process closes.
    Pty {
        pty: Arc<Pty>,
        closed: std::sync::atomic::AtomicBool,
    },
}

impl Stdin {
    pub fn is_none(&self) -> bool {
        matches!(self, Stdin::None)
    }

    /// Write all of `data`.
    pub async fn write(&self, data: &[u8]) -> Result<(), GatewayError> {
        let failed = || GatewayError::Internal("failed to write to process stdin".to_owned());
        match self {
            Stdin::None => Err(failed()),
            Stdin::Pipe(pipe) => {
                let mut guard = pipe.lock().await;
                let stdin = guard.as_mut().ok_or_else(failed)?;
                stdin.write_all(data).await.map_err(|_| failed())?;
                stdin.flush().await.map_err(|_| failed())
            }
            Stdin::Pty { pty, closed } => {
                if closed.load(std::sync::atomic::Ordering::Acquire) {
                    return Err(failed());
                }
                pty.write_all(data).await.map_err(|_| failed())
            }
        }
    }

    /// `process/closeStdin`: EOF on a pipe; ^D on a PTY.
    pub async fn close(&self) -> Result<(), GatewayError> {
        match self {
            Stdin::None => Ok(()),
            Stdin::Pipe(pipe) => {
                if let Some(mut s) = pipe.lock().await.take() {
                    let _ = s.shutdown().await;
                }
                Ok(())
            }
            Stdin::Pty { .. } => self.write(&[0x04]).await,
        }
    }

    /// The process closed: nothing more may be written.
    pub async fn release(&self) {
        match self {
            Stdin::None => {}
            Stdin::Pipe(pipe) => {
                pipe.lock().await.take();
            }
            Stdin::Pty { closed, .. } => closed.store(true, std::sync::atomic::Ordering::Release),
        }
    }
}
