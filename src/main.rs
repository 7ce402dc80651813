//! `kairos` — the command-line tool of the Kairos delayed-task engine.
//!
//! Runs the order-timeout demo on a real data directory (`kairos demo`) and
//! checks a data directory offline (`kairos verify`). The commands live in
//! `src/cli/`; this file only hands over to them.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
