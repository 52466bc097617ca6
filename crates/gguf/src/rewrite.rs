//! Rewrite a GGUF file with different metadata, copying every tensor's bytes unchanged
//! (offsets are recomputed, since the header size changes).

use crate::error::Result;
use crate::reader::GgufFile;
use crate::value::Metadata;
use crate::writer::{GgufWriter, TensorSpec};
use std::path::Path;

/// Write `src`'s tensors with `metadata` to `dest` (which may be `src`'s own path: the new file
/// replaces it atomically, and the old mapping stays valid until `src` is dropped).
pub fn rewrite_with_metadata(src: &GgufFile, metadata: &Metadata, dest: &Path) -> Result<()> {
    let specs: Vec<TensorSpec> = src.tensors().iter().map(TensorSpec::from).collect();
    let mut w = GgufWriter::create_version(dest, src.version(), metadata, &specs)?;
    for t in src.tensors() {
        w.write_tensor(src.tensor_data(t))?;
    }
    w.finish()
}
