//! The local terminal under `exec -t`: raw mode, restored on every way out,
//! and its size.

use rustix::termios::{OptionalActions, Termios, isatty, tcgetattr, tcgetwinsize, tcsetattr};

/// The terminal on stdin in raw mode until dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Raw mode on stdin's terminal; `None` when stdin is not a terminal
    /// (the process still gets one; input is passed on as it comes).
    pub fn enter() -> std::io::Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !isatty(&stdin) {
            return Ok(None);
        }
        let saved = tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(Some(RawMode { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Output already written is kept (TCSADRAIN); input typed after
        // the process ended is left for the shell.
        let _ = tcsetattr(std::io::stdin(), OptionalActions::Drain, &self.saved);
    }
}

/// Rows and columns of the terminal on stdout (else stdin).
pub fn window_size() -> Option<(u16, u16)> {
    let stdout = std::io::stdout();
    let ws = tcgetwinsize(&stdout)
        .or_else(|_| tcgetwinsize(std::io::stdin()))
        .ok()?;
    (ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}
