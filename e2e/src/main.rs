//! netpol-e2e: the end-to-end suite in network namespaces. Nodes and pods are namespaces
//! wired like an L3 CNI, the real netpol-agent enforces inside each node, and real packets
//! decide every cell of the upstream truth tables.

mod expect;
mod scenario;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "netpol-e2e", about = "NetworkPolicy end-to-end scenarios in network namespaces")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and validate scenarios without running them.
    Check {
        /// Scenario files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { paths } => check(&paths),
    }
}

fn check(paths: &[PathBuf]) -> ExitCode {
    let files = match scenario::scenario_files(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("netpol-e2e: {e:#}");
            return ExitCode::from(2);
        }
    };
    let mut names = std::collections::BTreeMap::new();
    let mut bad = 0;
    for file in &files {
        match scenario::load(file) {
            Ok(s) => {
                if let Some(other) = names.insert(s.name.clone(), file.clone()) {
                    println!("{}: name {:?} is also used by {}", file.display(), s.name, other.display());
                    bad += 1;
                }
            }
            Err(e) => {
                println!("{}: {e:#}", file.display());
                bad += 1;
            }
        }
    }
    println!("{} scenarios, {} valid, {} invalid", files.len(), files.len() - bad, bad);
    if bad == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
