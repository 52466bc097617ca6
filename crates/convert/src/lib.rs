//! HuggingFace model directories → GGUF: reading checkpoints ([`hf`]), the architecture table
//! ([`arch`]), tokenizer metadata ([`vocab`]), llama-quantize's per-tensor plan ([`plan`]), the
//! conversion pipeline ([`pipeline`]), GGUF → GGUF requantization ([`requant`]) and downloads from the
//! HuggingFace Hub ([`hub`]).

pub mod arch;
pub mod hf;
pub mod hub;
pub mod imatrix;
pub mod meta;
pub mod pipeline;
pub mod plan;
pub mod requant;
pub mod vocab;
