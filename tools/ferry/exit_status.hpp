// The ferry command's exit statuses: the one list the subcommands return and the README's table quotes.
// A script tells a bad command line (2) from a run that moved wrong bytes (3) from a finding it gates on
// (4) without reading stderr.
#pragma once

namespace ferry::cli::exit_status {

/// The run did what was asked; every checked byte arrived right (and with `analyze --fail-on`, no named
/// finding was present).
inline constexpr int ok = 0;
/// The run failed: a device error, a file that cannot be read or written, input that is not a trace.
inline constexpr int error = 1;
/// Usage: an unknown subcommand, a flag value out of its range, contradicting flags, an output path that
/// cannot be written. Nothing ran.
inline constexpr int usage = 2;
/// Wrong data: a bench (egress, ingest, allreduce, ddp) checked what arrived and found a wrong byte,
/// batch or gradient. What was measured is still printed.
inline constexpr int wrong_data = 3;
/// `ferry analyze --fail-on RULE,...`: a finding of a named rule is present. The analysis is still
/// printed.
inline constexpr int finding = 4;
/// Ctrl-C or SIGTERM (128 + SIGINT, as shells report it); a ladder prints the levels that finished.
inline constexpr int interrupted = 130;

}  // namespace ferry::cli::exit_status
