use std::path::PathBuf;

/// Everything that can go wrong reading or writing a GGUF file. Messages name the file, the byte
/// offset or key/tensor, what was expected and what was found.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file: expected magic \"GGUF\" at offset 0, found {found}")]
    BadMagic { path: PathBuf, found: String },
    #[error("{path}: unsupported GGUF version {version} at offset 4 (supported: 2 and 3){hint}")]
    Version {
        path: PathBuf,
        version: u32,
        hint: &'static str,
    },
    #[error(
        "{path}: truncated file: {what} at offset {offset} needs {needed} bytes, but the file ends at {file_size}"
    )]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        file_size: u64,
    },
    #[error("{path}: {what} at offset {offset}: {problem}")]
    Invalid {
        path: PathBuf,
        what: String,
        offset: u64,
        problem: String,
    },
    #[error("{path}: tensor `{tensor}`: {problem}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        problem: String,
    },
    #[error("{path}: split model: {problem}")]
    Split { path: PathBuf, problem: String },
    #[error("{path}: write: {problem}")]
    Write { path: PathBuf, problem: String },
}

impl GgufError {
    /// True when the error is about the content of an input file (as opposed to an I/O failure
    /// such as a full disk). Callers map this to "invalid input" exit codes.
    pub fn is_invalid_input(&self) -> bool {
        match self {
            GgufError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::IsADirectory | std::io::ErrorKind::PermissionDenied
            ),
            GgufError::Write { .. } => false,
            _ => true,
        }
    }
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
