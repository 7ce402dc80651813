//! `kairos` — the command-line tool of the Kairos delayed-task engine.
//!
//! Runs the order-timeout demo on a real data directory (`kairos demo`),
//! checks, dumps and summarizes a data directory offline (`kairos verify`,
//! `kairos dump`, `kairos inspect`) and manages its dead letters
//! (`kairos dead-letters`). The commands live in `src/cli/`; this file only
//! hands over to them.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
