use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Kubernetes operator for CDN clusters of nginx (CdnCluster) and one-shot commands (At).
#[derive(Parser)]
#[command(name = "cdn-operator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controllers against the cluster of KUBECONFIG, or the in-cluster config.
    Run(cdn_operator::run::Args),
    /// Print the CustomResourceDefinitions as YAML, generated from the code.
    Crd,
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", cdn_operator::api::crds_yaml());
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("cdn-operator {}", cdn_operator::VERSION);
            ExitCode::SUCCESS
        }
        Command::Run(args) => cdn_operator::run::main(args),
    }
}
