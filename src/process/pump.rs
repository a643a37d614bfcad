//! The one task per process that reads its output and its exit in
//! `select!`, so seqs are assigned *and* emitted in order, then closes it.

use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt as _;
use tokio::net::unix::pipe;

use super::OUTPUT_READ_CHUNK_BYTES;
use super::state::{GroupGuard, Process, ProcessPermits};
use crate::outbound::Attachment;
use crate::protocol::process::StreamName;
use crate::spawn::{self, Ended, ExitWait, Pty};

/// Where a process's output comes from.
pub enum Output {
    Pipes {
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
    },
    Pty(Arc<Pty>),
}

/// What the process's table does once the process has closed.
pub type OnClosed = Box<dyn FnOnce(&Arc<Process>) + Send>;

/// Everything the pump owns until the process closes.
pub struct Pump {
    pub process: Arc<Process>,
    pub attachment: Arc<Attachment>,
    pub exit: ExitWait,
    pub output: Output,
    /// Released (in this order) when the process closes.
    pub guard: GroupGuard,
    pub permits: ProcessPermits,
    /// Told last, after `closed` went out (the table forgets the process).
    pub on_closed: OnClosed,
    /// The session ended: stop reading (the process was killed; a pipe
    /// another session's process still holds must not keep it, and its
    /// retained output, forever).
    pub abandoned: tokio_util::sync::CancellationToken,
}

/// One output stream being read.
struct Source<R> {
    stream: StreamName,
    reader: Option<R>,
    buf: BytesMut,
    /// Bulk output: the pipe was grown once (short-lived processes never
    /// pay for this).
    grown: bool,
}

impl<R> Source<R> {
    fn new(stream: StreamName, reader: Option<R>) -> Self {
        Self {
            stream,
            reader,
            buf: BytesMut::new(),
            grown: false,
        }
    }

    fn open(&self) -> bool {
        self.reader.is_some()
    }
}

impl Source<pipe::Receiver> {
    async fn read(&mut self) -> io::Result<usize> {
        let Some(r) = &mut self.reader else {
            return std::future::pending().await;
        };
        self.buf.reserve(OUTPUT_READ_CHUNK_BYTES);
        let n = r.read_buf(&mut self.buf).await?;
        if !self.grown && n >= spawn::GROW_PIPE_AFTER_READ_BYTES {
            self.grown = true;
            spawn::grow_pipe(r);
        }
        Ok(n)
    }
}

impl Source<Arc<Pty>> {
    async fn read(&mut self) -> io::Result<usize> {
        let Some(p) = &self.reader else {
            return std::future::pending().await;
        };
        self.buf.reserve(OUTPUT_READ_CHUNK_BYTES);
        p.read(&mut self.buf).await
    }
}

impl Pump {
    pub async fn run(self) {
        let Pump {
            process,
            attachment,
            mut exit,
            output,
            guard,
            permits,
            on_closed,
            abandoned,
        } = self;
        let mut guard = Some(guard);
        let (stdout, stderr, pty) = match output {
            Output::Pipes { stdout, stderr } => (Some(stdout), Some(stderr), None),
            Output::Pty(p) => (None, None, Some(p)),
        };
        let mut stdout = Source::new(StreamName::Stdout, stdout);
        let mut stderr = Source::new(StreamName::Stderr, stderr);
        let mut pty = Source::new(StreamName::Pty, pty);
        process.hold_for_subscriber().await;
        let mut exited = false;
        while stdout.open() || stderr.open() || pty.open() || !exited {
            // Every arm is cancel-safe: reads and the exit wait lose nothing
            // when another arm wins.
            tokio::select! {
                r = stdout.read(), if stdout.open() => emit(&process, &attachment, &mut stdout.reader, &mut stdout.buf, stdout.stream, r).await,
                r = stderr.read(), if stderr.open() => emit(&process, &attachment, &mut stderr.reader, &mut stderr.buf, stderr.stream, r).await,
                r = pty.read(), if pty.open() => emit(&process, &attachment, &mut pty.reader, &mut pty.buf, pty.stream, r).await,
                () = abandoned.cancelled(), if stdout.open() || stderr.open() || pty.open() => {
                    stdout.reader = None;
                    stderr.reader = None;
                    pty.reader = None;
                }
                ended = exit.wait(), if !exited => {
                    exited = true;
                    // The leader is reaped: its number may be reused once its
                    // group empties, so the reaper must forget it now (the
                    // cgroup still reaches what is left).
                    guard.take();
                    if ended == Ended::WorkerDied {
                        process.worker_gone();
                    }
                    process
                        .emit_exit(&attachment, process.exit_code(ended), ended.signal())
                        .await;
                }
            }
        }
        process.stdin.release().await;
        // Its slots and its cgroup are free before the client hears it
        // closed: a client that starts another process on `closed` must
        // find the slot it just gave back.
        drop(permits);
        process.release_cgroup_if_empty();
        process.emit_closed(&attachment).await;
        // Closed: no signal goes to it any more; its pidfd is not kept for
        // the retention period.
        process.group.release();
        process.pty.lock().take();
        on_closed(&process);
    }
}

/// Reads at least this large are retained in the read buffer itself.
const SPLIT_AT_BYTES: usize = 64 * 1024;

/// Emit what a read produced; EOF or an error closes that stream.
async fn emit<R>(
    process: &Process,
    attachment: &Attachment,
    reader: &mut Option<R>,
    buf: &mut BytesMut,
    stream: StreamName,
    read: io::Result<usize>,
) {
    match read {
        Ok(n) if n > 0 => {
            // A small read is copied out and the buffer reused: split off,
            // it would keep the whole read buffer's allocation (and a
            // resident page) alive for as long as it is retained.
            let data = if n < SPLIT_AT_BYTES {
                let d = Bytes::copy_from_slice(&buf[..n]);
                buf.clear();
                d
            } else {
                buf.split().freeze()
            };
            process.emit_output(attachment, stream, data).await;
        }
        _ => *reader = None,
    }
}
