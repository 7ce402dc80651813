//! Command-line parsing and dispatch for the `kairos` binary.
//!
//! Exit codes: 0 — success; 1 — the command ran and found a problem (an
//! invariant of the demo broke, `verify` found damage) or failed (I/O error,
//! bad directory); 2 — bad command-line usage (from clap).

mod demo;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Kairos — an embeddable, durable delayed-task engine.
///
/// Schedule a task to fire at a moment in the future, cancel it by key
/// before then, receive it on consumer threads when it falls due. This tool
/// runs a demonstration workload against a real data directory and checks
/// data directories offline.
#[derive(Debug, Parser)]
#[command(name = "kairos", version, propagate_version = true)]
#[command(
    after_help = "Exit status: 0 on success, 1 when a check fails or an error occurs, \
                        2 on bad usage."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Demo(demo::DemoArgs),
    Verify(verify::VerifyArgs),
}

/// Parses the command line, runs the command and turns its outcome into the
/// process exit status. Errors are printed to stderr with their causes.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Verify(args) => verify::run(&args),
    };
    match outcome {
        Ok(Verdict::Pass) => ExitCode::SUCCESS,
        Ok(Verdict::Fail) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("kairos: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// What a command concluded about the thing it checked. Commands print
/// their own findings; this only sets the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Everything checked out (exit 0).
    Pass,
    /// A check failed (exit 1).
    Fail,
}
