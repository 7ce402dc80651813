//! A stand-in for the binary's `cli` module, so that the library can compile the binary's
//! `verify` command from its own file (`src/cli/verify.rs`): that file names the engine's
//! types and the command's verdict through `super::`, and finds them here as it finds them in
//! the binary. Only `verify::check` is used; the rest (argument parsing, printing) is the
//! binary's business.
#![allow(dead_code, unreachable_pub)]

pub(crate) use crate::checkpoint as ckpt;
pub(crate) use crate::far;
pub(crate) use crate::overflow as ovf;
pub(crate) use crate::record;
pub(crate) use crate::record::Record;
pub(crate) use crate::replay;
pub(crate) use crate::replay::Replay;

/// The binary's `cli::Verdict`, which `verify::run` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Everything checked out (exit 0).
    Pass,
    /// A check failed (exit 1).
    Fail,
}

/// The binary's `outln!`, for `verify.rs` (its printing is unused here).
macro_rules! outln {
    () => {
        super::write_out(format_args!(""))
    };
    ($($arg:tt)*) => {
        super::write_out(format_args!($($arg)*))
    };
}

/// The binary's `cli::write_out`: one line to stdout, errors ignored.
pub(crate) fn write_out(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The binary's `errln!`, for `verify.rs`.
macro_rules! errln {
    ($($arg:tt)*) => {
        crate::fuzzing::cli::write_err(format_args!($($arg)*))
    };
}

/// The binary's `cli::write_err`: one line to stderr, errors ignored.
pub(crate) fn write_err(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[path = "../cli/verify.rs"]
pub(crate) mod verify;
