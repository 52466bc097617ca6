//! The binary's error type and its exit codes (DESIGN.md): 0 ok, 1 runtime or conversion error,
//! 2 quality threshold exceeded, 3 invalid input or arguments.

use std::fmt;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A failure while doing valid work (I/O error, full disk, device failure).
    Runtime = 1,
    /// A measured quality threshold was exceeded.
    #[allow(dead_code)]
    Quality = 2,
    /// Bad input: arguments, files, values.
    Input = 3,
}

#[derive(Debug)]
pub struct CliError {
    pub kind: Kind,
    pub message: String,
}

impl CliError {
    pub fn input(message: impl Into<String>) -> Self {
        CliError {
            kind: Kind::Input,
            message: message.into(),
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        CliError {
            kind: Kind::Runtime,
            message: message.into(),
        }
    }
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.kind as u8)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<gguf::GgufError> for CliError {
    fn from(e: gguf::GgufError) -> Self {
        let kind = if e.is_invalid_input() {
            Kind::Input
        } else {
            Kind::Runtime
        };
        CliError {
            kind,
            message: e.to_string(),
        }
    }
}

impl From<convert::hf::HfError> for CliError {
    fn from(e: convert::hf::HfError) -> Self {
        CliError::input(e.to_string())
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;

impl From<engine::EngineError> for CliError {
    fn from(e: engine::EngineError) -> Self {
        if e.is_input() {
            CliError::input(e.to_string())
        } else {
            CliError::runtime(e.to_string())
        }
    }
}
