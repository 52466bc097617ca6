//! Developer aid: with `HF2Q_DUMP=FILE`, model graphs append every named intermediate tensor to
//! FILE (u32 name length, name, 4 × i64 shape in ggml order, u64 count, f32 values), the layout
//! of the small llama.cpp eval-callback dumper used to compare the two engines op by op.

use crate::backend::Backend;
use std::io::Write;

pub struct Dump(Option<std::fs::File>);

impl Dump {
    pub fn from_env() -> Dump {
        let f = std::env::var_os("HF2Q_DUMP")
            .and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok());
        Dump(f)
    }

    /// Whether tensors are being dumped (models then keep every named tensor apart).
    pub fn on(&self) -> bool {
        self.0.is_some()
    }

    pub fn put<B: Backend>(&mut self, b: &B, name: &str, x: &B::Buf) {
        let Some(f) = &mut self.0 else { return };
        let (rows, cols) = b.shape(x);
        let v = b.read(x);
        let mut out = Vec::with_capacity(64 + 4 * v.len());
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        for d in [cols as i64, rows as i64, 1, 1] {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
        let _ = f.write_all(&out);
    }
}
