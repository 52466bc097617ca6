//! `hf2q`: the command-line entry point. Parses arguments, sets up logging, dispatches to a
//! subcommand and maps its outcome to an exit code (see `error.rs`).

mod cmd;
mod error;
mod json;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use error::{CliError, CliResult};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "hf2q",
    version,
    about = "Convert HuggingFace models to GGUF; inspect, edit and quantize GGUF files; generate, embed and serve (OpenAI API) on the CPU",
    propagate_version = true
)]
struct Cli {
    /// More logging: -v for debug, -vv for trace (overridden by --log-level).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Log level: error, warn, info, debug, trace (or a tracing filter such as `gguf=debug`).
    #[arg(long, global = true, env = "HF2Q_LOG")]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a GGUF file (architecture, sizes, tokenizer, tensor types) or a HuggingFace model directory.
    Info(cmd::info::InfoArgs),
    /// Set, change or delete metadata keys of a GGUF file; tensor data is copied untouched.
    GgufPatch(cmd::patch::PatchArgs),
    /// Convert a HuggingFace model directory to GGUF (any llama.cpp file type).
    Convert(cmd::convert::ConvertArgs),
    /// Quantize a GGUF file to another file type, with llama-quantize's per-tensor plan.
    Quantize(cmd::quantize::QuantizeArgs),
    /// Report CPU features, memory, NVIDIA GPUs, cache directory and free disk.
    Doctor(cmd::doctor::DoctorArgs),
    /// Generate text from a GGUF model (streaming to stdout).
    Generate(cmd::generate::GenerateArgs),
    /// Measure prompt-processing and generation speed (llama-bench style).
    Bench(cmd::bench::BenchArgs),
    /// Perplexity of a text file (llama-perplexity style).
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Serve GGUF models over an OpenAI-compatible HTTP API.
    Serve(cmd::serve::ServeArgs),
    /// Embedding vectors from a BERT / Nomic-BERT GGUF.
    Embed(cmd::embed::EmbedArgs),
    /// Print a shell completion script.
    Completions {
        /// Shell to generate completions for.
        shell: clap_complete::Shell,
    },
}

fn init_logging(cli: &Cli) -> CliResult {
    use tracing_subscriber::EnvFilter;
    let level = match (&cli.log_level, cli.verbose) {
        (Some(l), _) => l.clone(),
        (None, 0) => "warn".into(),
        (None, 1) => "debug".into(),
        (None, _) => "trace".into(),
    };
    let filter =
        EnvFilter::try_new(&level).map_err(|e| CliError::input(format!("invalid --log-level `{level}`: {e}")))?;
    // Colours only on a terminal: logs sent to a file or a pipe stay plain text.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn run(cli: Cli) -> CliResult {
    init_logging(&cli)?;
    match cli.command {
        Command::Info(args) => cmd::info::run(args),
        Command::GgufPatch(args) => cmd::patch::run(args),
        Command::Convert(args) => cmd::convert::run(args),
        Command::Quantize(args) => cmd::quantize::run(args),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Embed(args) => cmd::embed::run(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "hf2q", &mut std::io::stdout());
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                        ExitCode::from(error::Kind::Input as u8)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                _ => ExitCode::from(error::Kind::Input as u8),
            };
        }
    };
    // A command whose output goes to a pipe that closes (`hf2q info FILE | head`) ends quietly,
    // as other command-line tools do, instead of panicking in `println!`. The server keeps Rust's
    // ignored SIGPIPE: a client that hangs up is an error on that connection, never a signal.
    #[cfg(unix)]
    if !matches!(cli.command, Command::Serve(_)) {
        // SAFETY: restoring the default disposition of one signal before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message.replace('\n', " "));
            e.exit_code()
        }
    }
}
