//! Command-line parsing and dispatch for the `kairos` binary.
//!
//! Exit codes: 0 — success; 1 — the command ran and found a problem (an
//! invariant of the demo broke, `verify`, `dump` or `inspect` found damage) or
//! failed (I/O error, bad directory); 2 — bad command-line usage (from clap).

/// `println!` for a command's output on stdout, through [`write_out`]: a
/// closed pipe (`kairos verify DIR | head`) drops the rest of the output
/// instead of panicking. (Also defined, the same, in the library's stand-in
/// for this module, `fuzzing::cli`, which compiles `verify.rs` too.)
macro_rules! outln {
    () => {
        super::write_out(format_args!(""))
    };
    ($($arg:tt)*) => {
        super::write_out(format_args!($($arg)*))
    };
}

/// `eprintln!` through [`write_err`]: a closed or failing stderr
/// (`kairos verify DIR 2>&1 | head -1`) drops the message instead of
/// panicking. (Also defined in `fuzzing::cli`, as `outln!` is.)
macro_rules! errln {
    ($($arg:tt)*) => {
        crate::cli::write_err(format_args!($($arg)*))
    };
}

mod bench;
mod checkpoint;
mod dead_letters;
mod demo;
mod describe;
mod dump;
mod inspect;
mod salvage;
mod verify;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kairos::Durability;
// For `verify`, which names them through `super::` (it is compiled into the library too).
use kairos::checkpoint as ckpt;
use kairos::far;
use kairos::overflow as ovf;
use kairos::record;
use kairos::record::Record;
use kairos::replay;
use kairos::replay::Replay;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
/// Shared with the fuzz build, which compiles `verify.rs` on its own.
pub(crate) use verify::plural;

/// Set once a write to stdout has failed: the rest of the output is dropped.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// Set when that failure was not a closed pipe: the exit status is then 1.
static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);

/// Writes one line of a command's output to stdout (see `outln!`). A closed
/// pipe ends the output quietly, as it ends other Unix tools' (the command's
/// verdict still sets the exit status); any other write error is reported
/// once on stderr and makes the exit status 1.
pub(crate) fn write_out(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            write_err(format_args!("kairos: error: cannot write to stdout: {e}"));
            STDOUT_FAILED.store(true, Ordering::Relaxed);
        }
    }
}

/// Writes one line to stderr (see `errln!`); a write error is ignored, as
/// there is nowhere left to report it.
pub(crate) fn write_err(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// An error and its causes, `: `-separated, as `{:#}` prints them — but a
/// cause whose text the message before it ends with (an error that prints
/// its source and also returns it from `source()`, as
/// `kairos_wal::WalError::Io` does) is not repeated.
fn chain(error: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !last.is_empty() && last.ends_with(&text) {
            last = text;
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

/// Kairos — an embeddable, durable delayed-task engine.
///
/// Schedule a task to fire at a moment in the future, cancel it by key
/// before then, receive it on consumer threads when it falls due. This tool
/// runs a demonstration workload against a real data directory, measures the
/// engine under a load, checks, dumps, summarizes and checkpoints data
/// directories offline, manages their dead letters offline, and salvages a directory whose
/// overflow entries are damaged.
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
    Checkpoint(checkpoint::CheckpointArgs),
    Demo(demo::DemoArgs),
    Bench(bench::BenchArgs),
    /// Reopen a data directory and print what it cost (run by `kairos bench`).
    #[command(hide = true)]
    BenchReopen(bench::ReopenArgs),
    Verify(verify::VerifyArgs),
    Dump(dump::DumpArgs),
    Inspect(inspect::InspectArgs),
    DeadLetters(dead_letters::DeadLettersArgs),
    Salvage(salvage::SalvageArgs),
}

/// Parses the command line, runs the command and turns its outcome into the
/// process exit status. Errors are printed to stderr with their causes.
pub fn main() -> ExitCode {
    let cli = parse();
    let outcome = match cli.command {
        Command::Checkpoint(args) => checkpoint::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::BenchReopen(args) => bench::run_reopen(&args),
        Command::Verify(args) => verify::run(&args),
        Command::Dump(args) => dump::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::DeadLetters(args) => dead_letters::run(&args),
        Command::Salvage(args) => salvage::run(&args),
    };
    let code = match outcome {
        Ok(Verdict::Pass) => ExitCode::SUCCESS,
        Ok(Verdict::Fail) => ExitCode::FAILURE,
        // Arguments that parse one by one but not together (`usage_error`): clap prints it
        // and exits 2, as for any other bad usage.
        Err(error) if error.is::<clap::Error>() => match error.downcast::<clap::Error>() {
            Ok(usage) => usage.exit(),
            Err(error) => {
                write_err(format_args!("kairos: error: {}", chain(&error)));
                ExitCode::FAILURE
            }
        },
        Err(error) => {
            write_err(format_args!("kairos: error: {}", chain(&error)));
            ExitCode::FAILURE
        }
    };
    if STDOUT_FAILED.load(Ordering::Relaxed) {
        return ExitCode::FAILURE;
    }
    code
}

/// Parses the command line as `Cli::parse` does, but with every option that takes a value
/// accepting one that is a negative number (`--tasks -5`): the option's own check then refuses
/// it naming the option and its range (`invalid value '-5' for '--tasks <N>'`), where clap
/// would take `-5` for an unknown flag ("unexpected argument '-5' found") and leave the option
/// unnamed. (Only values that read as numbers: a flag after the option stays a flag. The
/// options taking a duration, `-5s` being no number, take any value beginning with '-'
/// themselves — `allow_hyphen_values`: no duration begins with one, so a flag taken for their
/// value is refused by their check too.)
fn parse() -> Cli {
    use clap::{CommandFactory as _, FromArgMatches as _};
    fn negative_values(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| {
                if arg.is_positional() || !arg.get_action().takes_values() {
                    arg
                } else {
                    arg.allow_negative_numbers(true)
                }
            })
            .mut_subcommands(negative_values)
    }
    let matches = negative_values(Cli::command()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// A usage error found after parsing — arguments each valid but not together — reported by
/// clap with the usage of `subcommand` (words: `"dead-letters list"`; exit status 2) once
/// `main` gets it back. `kind`:
/// `ArgumentConflict` for arguments that exclude each other, `ValueValidation` for a value
/// another argument bounds.
pub(crate) fn usage_error(
    subcommand: &str,
    kind: clap::error::ErrorKind,
    message: impl std::fmt::Display,
) -> anyhow::Error {
    use clap::CommandFactory as _;
    let mut cli = Cli::command();
    cli.build();
    // The innermost command named (`build` gave it its full name), so its own usage line
    // is printed.
    let mut command = cli;
    for name in subcommand.split_whitespace() {
        match command.find_subcommand(name) {
            Some(inner) => command = inner.clone(),
            None => break,
        }
    }
    anyhow::Error::new(command.error(kind, message))
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

/// `--durability` and `--interval-ms`, shared by the commands that open an engine.
#[derive(Debug, Clone, Copy, Args)]
pub struct DurabilityArgs {
    /// When a call returns relative to its log record reaching the disk.
    #[arg(long = "durability", value_enum, default_value_t = DurabilityMode::Sync)]
    pub mode: DurabilityMode,
    /// Background sync period for `--durability interval`, ms [default: 10]; only with
    /// `--durability interval`.
    #[arg(long = "interval-ms", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..))]
    interval_ms_given: Option<u64>,
}

/// The default `--interval-ms`.
const INTERVAL_MS_DEFAULT: u64 = 10;

impl DurabilityArgs {
    /// The engine's durability mode.
    pub fn durability(&self) -> Durability {
        match self.mode {
            DurabilityMode::Sync => Durability::Sync,
            DurabilityMode::Interval => {
                Durability::Interval(Duration::from_millis(self.interval_ms()))
            }
            DurabilityMode::Buffered => Durability::Buffered,
        }
    }

    /// `--interval-ms`, or its default.
    pub fn interval_ms(&self) -> u64 {
        self.interval_ms_given.unwrap_or(INTERVAL_MS_DEFAULT)
    }

    /// A usage error (for `subcommand`) if `--interval-ms` is given without `--durability
    /// interval`, which alone uses it.
    pub fn check(&self, subcommand: &str) -> anyhow::Result<()> {
        match (self.mode, self.interval_ms_given) {
            (DurabilityMode::Interval, _) | (_, None) => Ok(()),
            (mode, Some(_)) => Err(usage_error(
                subcommand,
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--interval-ms is the sync period of --durability interval; with \
                     --durability {} it would be ignored",
                    format!("{mode:?}").to_lowercase()
                ),
            )),
        }
    }
}

/// `--durability` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityMode {
    /// Each call returns once its record is fdatasynced (group commit).
    Sync,
    /// Written to the OS at once, synced every --interval-ms.
    Interval,
    /// Written to the OS; synced at segment roll, checkpoint and shutdown, and written back
    /// every 4 MiB.
    Buffered,
}

/// A duration (`--delay` of `dead-letters requeue`, `--horizon` of `demo`):
/// `0`, or one or more `<whole number><unit>` groups with units `ms`, `s`,
/// `m`, `h`, `d` (`1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_or(
        text,
        "use 0 or whole numbers with units ms, s, m, h, d (e.g. 30s, 1h30m)",
    )
}

/// [`parse_duration`], saying `hint` after "`text` is not a duration: " when `text` is not
/// one (for an argument that takes other values too, or not 0).
pub fn parse_duration_or(text: &str, hint: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("{text:?} is not a duration: {hint}");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        let ms = number
            .checked_mul(unit_ms)
            .ok_or_else(|| format!("{text:?} is too long a duration"))?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| format!("{text:?} is too long a duration"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_the_rest() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(ms(250)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("5m"), Ok(ms(300_000)));
        assert_eq!(parse_duration("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse_duration("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in [
            "",
            "5",
            "s",
            "1.5s",
            "-1s",
            "1w",
            "1h 30m",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_duration("18446744073709551615d").is_err());
    }
}

#[cfg(test)]
mod chain_tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{op}: {source}")]
    struct Wrapper {
        op: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_its_wrapper_ends_with_is_not_repeated() {
        let e = anyhow::Error::new(Wrapper {
            op: "write 1.seg",
            source: std::io::Error::other("disk on fire"),
        })
        .context("cannot open x");
        assert_eq!(chain(&e), "cannot open x: write 1.seg: disk on fire");
        assert_eq!(
            format!("{e:#}"),
            "cannot open x: write 1.seg: disk on fire: disk on fire"
        );
    }

    #[test]
    fn a_cause_found_elsewhere_in_its_wrapper_stays() {
        let e = anyhow::Error::new(std::io::Error::other("fire")).context("fire drill failed");
        assert_eq!(chain(&e), "fire drill failed: fire");
    }
}
