//! The GGUF v2/v3 file format.
//!
//! - [`value`]: the metadata value types and the ordered metadata map;
//! - [`ggml_type`]: the table of ggml tensor types and their storage layout;
//! - [`reader`]: validated parsing ([`parse_header`]) and the memory-mapped [`GgufFile`];
//! - [`writer`]: the streaming, atomic [`GgufWriter`];
//! - [`split`]: models split over several files, opened as one [`GgufModel`];
//! - [`arch`]: the architectures, their tensor names and hyper-parameter keys (shared by convert
//!   and the engine);
//! - [`rewrite`]: copy a file with new metadata, tensor data untouched (`gguf-patch`).

pub mod arch;
pub mod error;
pub mod file_type;
pub mod ggml_type;
pub mod keys;
pub mod reader;
pub mod rewrite;
pub mod split;
pub mod value;
pub mod writer;

pub use arch::{Arch, Tensor};
pub use error::{GgufError, Result};
pub use ggml_type::{GgmlType, TypeLayout, TYPE_TABLE};
pub use reader::{parse_header, GgufFile, Header, TensorInfo};
pub use split::GgufModel;
pub use value::{Array, Metadata, StrArray, Value, ValueType};
pub use writer::{GgufWriter, TensorSpec};
