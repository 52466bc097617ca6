//! Corrupt input never panics and never makes the reader allocate more than the file's size:
//! the real SmolLM2 GGUF truncated at many offsets and mutated at random, and a shrunken copy
//! of it (same keys and tensor infos, vocabulary and merges cut to 300 entries) truncated at
//! every single offset of its header.
//!
//! Truncating the real file at *every* offset of its 1.7 MB header would be quadratic (each
//! parse reads up to the cut); the shrunken copy exercises every field of the same structure at
//! every offset, and the real file is cut at every offset of its first 64 KiB, at every field
//! boundary of about 230 of its 272 tensor infos and at 1,000 seeded random offsets.

mod common;
use common::*;
use gguf::{parse_header, Array, GgufFile, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Records the largest single allocation made while `MEASURING` is set on the current thread.
struct Counting;
static MAX_ALLOC: AtomicUsize = AtomicUsize::new(0);
thread_local! { static MEASURING: Cell<bool> = const { Cell::new(false) }; }

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if MEASURING.with(|m| m.get()) {
            MAX_ALLOC.fetch_max(l.size(), Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if MEASURING.with(|m| m.get()) {
            MAX_ALLOC.fetch_max(new, Ordering::Relaxed);
        }
        System.realloc(p, l, new)
    }
}
#[global_allocator]
static A: Counting = Counting;

/// Parse `buf`, turning a panic into a test failure that names `what`, and checking the
/// largest allocation against `limit`. Returns whether the parse succeeded.
fn parse_checked(buf: &[u8], limit: usize, what: &dyn Fn() -> String) -> bool {
    MAX_ALLOC.store(0, Ordering::Relaxed);
    MEASURING.with(|m| m.set(true));
    let r = catch_unwind(AssertUnwindSafe(|| parse_header(buf, Path::new("t.gguf")).is_ok()));
    MEASURING.with(|m| m.set(false));
    let ok = r.unwrap_or_else(|_| panic!("parser panicked on {}", what()));
    let max = MAX_ALLOC.load(Ordering::Relaxed);
    assert!(
        max <= limit,
        "allocation of {max} bytes (> file size {limit}) on {}",
        what()
    );
    ok
}

fn shrunken_smollm2(dir: &Path) -> std::path::PathBuf {
    let f = GgufFile::open(smollm2()).unwrap();
    let mut m = f.metadata().clone();
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"] {
        let Some(Value::Array(Array::String(v))) = m.get(key).cloned() else {
            panic!("{key}")
        };
        m.insert(key, Value::Array(Array::String(v.truncated(300))));
    }
    let Some(Value::Array(Array::I32(v))) = m.get("tokenizer.ggml.token_type").cloned() else {
        panic!()
    };
    m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(v[..300].to_vec())));
    let out = dir.join("shrunken.gguf");
    gguf::rewrite::rewrite_with_metadata(&f, &m, &out).unwrap();
    out
}

fn map(path: &Path) -> memmap2::Mmap {
    unsafe { memmap2::Mmap::map(&std::fs::File::open(path).unwrap()).unwrap() }
}

#[test]
fn shrunken_smollm2_truncated_at_every_header_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = shrunken_smollm2(dir.path());
    let bytes = map(&path);
    let h = parse_header(&bytes, &path).unwrap();
    assert_eq!(h.metadata.len(), 33);
    assert_eq!(h.tensors.len(), 272);
    let end = h.data_offset as usize;
    for k in 0..end {
        assert!(
            !parse_checked(&bytes[..k], bytes.len(), &|| format!("truncation at {k}")),
            "cut at {k} parsed"
        );
    }
    // Cut inside the tensor data: still an error (data past end of file).
    for k in [end, end + 1, bytes.len() / 2, bytes.len() - 1] {
        assert!(!parse_checked(&bytes[..k], bytes.len(), &|| format!(
            "truncation at {k}"
        )));
    }
}

#[test]
fn smollm2_truncated_at_many_offsets() {
    let path = smollm2();
    let bytes = map(&path);
    let h = parse_header(&bytes, &path).unwrap();
    let end = h.data_offset as usize;
    let mut cuts: Vec<usize> = (0..16384).collect();
    // Every field boundary (and the byte after it) of each tensor info. The table starts after
    // the 24-byte header and the encoded key/value pairs.
    let mut at = 24;
    for (k, v) in h.metadata.iter() {
        let mut enc = Vec::new();
        gguf::writer::encode_value(&mut enc, v);
        at += 8 + k.len() + 4 + enc.len();
    }
    let mut rng = Rng(0x5eed_0001);
    let n = h.tensors.len();
    // Every boundary of the first and last 16 tensor infos, and of 200 others picked at random.
    let picked: Vec<bool> = (0..n)
        .map(|i| i < 16 || i >= n - 16 || rng.below(n as u64) < 200)
        .collect();
    for (t, pick) in h.tensors.iter().zip(picked) {
        let mut fields = vec![8, t.name.len(), 4];
        fields.extend(std::iter::repeat_n(8, t.shape.len()));
        fields.extend([4, 8]);
        for f in fields {
            if pick {
                cuts.extend([at, at + 1]);
            }
            at += f;
        }
    }
    cuts.extend((0..1000).map(|_| rng.below(end as u64) as usize));
    cuts.retain(|&k| k < end);
    for &k in &cuts {
        assert!(
            !parse_checked(&bytes[..k], bytes.len(), &|| format!("truncation at {k}")),
            "cut at {k} parsed"
        );
    }
}

/// Mutate 1-4 random bytes of the header region per trial; every trial must end in Ok or Err.
fn mutations(path: &Path, trials: usize, seed: u64) -> (usize, usize) {
    let src = map(path);
    let end = parse_header(&src, path).unwrap().data_offset as usize;
    let mut buf = memmap2::MmapMut::map_anon(src.len()).unwrap();
    buf.copy_from_slice(&src);
    let mut rng = Rng(seed);
    let (mut ok, mut err) = (0, 0);
    for trial in 0..trials {
        let n = 1 + rng.below(4) as usize;
        let mut saved = Vec::with_capacity(n);
        for _ in 0..n {
            let i = rng.below(end as u64) as usize;
            saved.push((i, buf[i]));
            // Mix of random bytes and values that often matter (0, 0xff, small ints).
            buf[i] = match rng.below(4) {
                0 => 0,
                1 => 0xff,
                2 => rng.below(16) as u8,
                _ => rng.next() as u8,
            };
        }
        if parse_checked(&buf, src.len(), &|| {
            format!("mutation trial {trial} (seed {seed:#x}): {saved:?}")
        }) {
            ok += 1;
        } else {
            err += 1;
        }
        for (i, b) in saved.into_iter().rev() {
            buf[i] = b;
        }
    }
    (ok, err)
}

#[test]
fn smollm2_random_mutations() {
    // Two threads of 5,000 trials each (different seeds), one per core.
    let path = smollm2();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| mutations(&path, 5_000, 0x5eed_0002));
        let b = s.spawn(|| mutations(&path, 5_000, 0x5eed_0004));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (ok, err) = (a.0 + b.0, a.1 + b.1);
    eprintln!("real file: {ok} mutations still parsed, {err} rejected");
    assert!(err > 1000, "most header mutations should be detected ({err} of 10000)");
}

#[test]
fn shrunken_smollm2_random_mutations() {
    let dir = tempfile::tempdir().unwrap();
    let path = shrunken_smollm2(dir.path());
    let (ok, err) = mutations(&path, 20_000, 0x5eed_0003);
    eprintln!("shrunken file: {ok} mutations still parsed, {err} rejected");
    assert!(err > 5000);
}
