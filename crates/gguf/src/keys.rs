//! Metadata keys this crate interprets (names from `gguf-py/gguf/constants.py`).

pub const ARCHITECTURE: &str = "general.architecture";
pub const ALIGNMENT: &str = "general.alignment";
pub const NAME: &str = "general.name";
pub const FILE_TYPE: &str = "general.file_type";
pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// Alignment of tensor data when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u32 = 32;
