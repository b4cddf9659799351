#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::process::ExitCode;

use clap::Parser;
use observer::cli::{init_logging, plugin_args, run, runtime, Cli};

fn main() -> anyhow::Result<ExitCode> {
    // Installed as `kubectl-observer`, it is kubectl's plugin (`kubectl observer explain POD`).
    let cli = Cli::parse_from(plugin_args(std::env::args_os()));
    let logs = init_logging(&cli.log, cli.log_format)?;
    let code = runtime()?.block_on(run(cli));
    // The last lines are written before the process exits.
    drop(logs);
    code
}
