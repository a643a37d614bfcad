//! `exec-gateway bench`: placeholder, filled in below.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

pub async fn run(_args: BenchArgs) -> ExitCode {
    ExitCode::SUCCESS
}
