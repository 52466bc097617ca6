//! HuggingFace model directories. So far: inspection of what a directory holds
//! (`hf2q info DIR`); conversion to GGUF is not implemented in this version.

pub mod hf;
pub mod plan;
pub mod requant;
