//! HuggingFace model directories → GGUF: reading checkpoints ([`hf`]), the architecture table
//! ([`arch`]), tokenizer metadata ([`vocab`]), llama-quantize's per-tensor plan ([`plan`]), the
//! conversion pipeline ([`pipeline`]) and GGUF → GGUF requantization ([`requant`]).

pub mod arch;
pub mod hf;
pub mod imatrix;
pub mod meta;
pub mod pipeline;
pub mod plan;
pub mod requant;
pub mod vocab;
