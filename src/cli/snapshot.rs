//! `exec-gateway snapshot`: the tenant's snapshots from the command line
//! (docs/snapshots.md), over either door.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;

use super::remote::{ClientArgs, connect, fail};
use crate::client::{Snapshot, SnapshotOp};

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub op: Op,
}

#[derive(Debug, clap::Subcommand)]
pub enum Op {
    /// Save a workspace: a session's (--session, e.g. a fork's), else the
    /// tenant's root. Prints the snapshot (JSON).
    Create {
        /// The session whose workspace to save. Default:
        /// EXEC_GATEWAY_SESSION, else a new session (the tenant's root).
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        name: Option<String>,
        /// `KEY=VALUE` (repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
    },
    /// The tenant's snapshots on this replica, oldest first.
    List {
        /// One JSON object per snapshot instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One snapshot (JSON).
    Get { id: String },
    /// Delete a snapshot (forks working in it keep it).
    Delete { id: String },
    /// Push a snapshot to the gateway's snapshot registry, from which any
    /// replica restores it. Prints the snapshot (JSON), `pushed` set.
    Push { id: String },
    /// Keep a snapshot until it is deleted (and push it, with a registry).
    Promote { id: String },
}

/// `exec-gateway snapshot`.
pub async fn snapshot(args: SnapshotArgs) -> ExitCode {
    let table = matches!(args.op, Op::List { json: false });
    let (op, session) = match args.op {
        Op::Create {
            session,
            name,
            labels,
        } => {
            let mut map = BTreeMap::new();
            for kv in labels {
                match kv.split_once('=') {
                    Some((k, v)) => {
                        map.insert(k.to_owned(), v.to_owned());
                    }
                    None => return fail(format!("snapshot: --label `{kv}` is not KEY=VALUE")),
                }
            }
            let session = session.or_else(|| {
                std::env::var("EXEC_GATEWAY_SESSION")
                    .ok()
                    .filter(|s| !s.is_empty())
            });
            (SnapshotOp::Create { name, labels: map }, session)
        }
        Op::List { .. } => (SnapshotOp::List, None),
        Op::Get { ref id } => (SnapshotOp::Get(id.clone()), None),
        Op::Delete { ref id } => (SnapshotOp::Delete(id.clone()), None),
        Op::Push { ref id } => (SnapshotOp::Push(id.clone()), None),
        Op::Promote { ref id } => (SnapshotOp::Promote(id.clone()), None),
    };
    let client = match connect(&args.client, session, None).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let got = client.snapshot(&op).await;
    let _ = client.close().await;
    let snapshots = match got {
        Ok(s) => s,
        Err(e) => return fail(format!("snapshot: {e}")),
    };
    let mut out = std::io::stdout().lock();
    if table {
        let _ = writeln!(
            out,
            "{:<37} {:<24} {:>12} {:>9} {:<8} {:<7}",
            "ID", "NAME", "BYTES", "ENTRIES", "KEPT", "PUSHED"
        );
        for s in &snapshots {
            let _ = writeln!(out, "{}", row(s));
        }
    } else {
        for s in &snapshots {
            match serde_json::to_string(s) {
                Ok(line) => {
                    let _ = writeln!(out, "{line}");
                }
                Err(e) => return fail(e),
            }
        }
    }
    ExitCode::SUCCESS
}

fn row(s: &Snapshot) -> String {
    let mut name: String = s.name.clone().unwrap_or_else(|| "-".into());
    if name.chars().count() > 24 {
        name = name.chars().take(23).collect::<String>() + "…";
    }
    format!(
        "{:<37} {:<24} {:>12} {:>9} {:<8} {:<7}",
        s.id,
        name,
        s.bytes,
        s.entries,
        if s.expires_at_ms.is_none() {
            "always"
        } else {
            "retained"
        },
        if s.pushed.is_some() { "yes" } else { "no" }
    )
}
