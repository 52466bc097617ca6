//! hf2q's runtime: the [`backend::Backend`] seam with its CPU implementation, model graphs
//! ([`model`]), the tokenizer built from GGUF metadata ([`tokenizer`]), chat templates ([`chat`]),
//! sampling ([`sampler`]), speculative decoding ([`spec`]), and discovery of the compute devices
//! ([`device`]).

pub mod backend;
pub mod chat;
pub mod debug;
pub mod device;
pub mod gbnf;
pub mod generate;
pub mod grammar;
pub mod model;
pub mod sampler;
pub mod spec;
pub mod tokenizer;

/// Errors of the engine. `Input` and `Unsupported` are the caller's to fix (exit 3 in the CLI).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Model(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Backend(String),
    #[error("the prompt and generation need {need} positions but the context holds {n_ctx}")]
    ContextFull { need: usize, n_ctx: usize },
}

impl EngineError {
    /// Whether the error is about the user's input or files rather than a failure of hf2q.
    pub fn is_input(&self) -> bool {
        !matches!(self, EngineError::Backend(_))
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
