#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::process::ExitCode;

use clap::Parser;
use observer::cli::{init_logging, run, runtime, Cli};

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    init_logging(&cli.log, cli.log_format)?;
    runtime()?.block_on(run(cli))
}
