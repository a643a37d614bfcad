//! `exec-gateway`: see `exec_gateway::cli` for the commands.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    exec_gateway::cli::run(exec_gateway::cli::Cli::parse())
}
