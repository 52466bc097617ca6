//! The ggml tensor types that can appear in a GGUF file, as one table (ggml's `type_traits[]`
//! in `ggml/src/ggml.c`, ids from `ggml/include/ggml.h` of llama.cpp b11434).
//!
//! This crate only needs the storage layout (block size and bytes per block) to validate and
//! size tensor data; the `quant` crate keys its codecs on [`GgmlType`].

use std::fmt;

/// Storage layout of one ggml type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeLayout {
    pub ty: GgmlType,
    /// Name as ggml prints it (`ggml_type_name`), e.g. `q4_K`.
    pub name: &'static str,
    /// Number of values in one block.
    pub block_size: u64,
    /// Bytes taken by one block.
    pub type_size: u64,
    /// Whether the type is a block-quantized format (as opposed to a plain float or integer).
    pub is_quantized: bool,
}

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $bs:literal, $sz:literal, $q:literal; )*) => {
        /// A ggml tensor type. The discriminant is the id stored in GGUF tensor infos.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        #[repr(u32)]
        pub enum GgmlType { $( $variant = $id, )* }

        /// Every known type, in id order.
        pub const TYPE_TABLE: &[TypeLayout] = &[
            $( TypeLayout { ty: GgmlType::$variant, name: $name, block_size: $bs, type_size: $sz, is_quantized: $q }, )*
        ];

        impl GgmlType {
            /// The type with GGUF id `id`, or `None` for ids ggml does not define (or has removed).
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id { $( $id => Some(GgmlType::$variant), )* _ => None }
            }

            pub fn layout(self) -> &'static TypeLayout {
                match self { $( GgmlType::$variant => &TypeLayout { ty: GgmlType::$variant, name: $name, block_size: $bs, type_size: $sz, is_quantized: $q }, )* }
            }
        }
    };
}

// variant = id, ggml name, block size, bytes per block, quantized
ggml_types! {
    F32 = 0, "f32", 1, 4, false;
    F16 = 1, "f16", 1, 2, false;
    Q4_0 = 2, "q4_0", 32, 18, true;
    Q4_1 = 3, "q4_1", 32, 20, true;
    Q5_0 = 6, "q5_0", 32, 22, true;
    Q5_1 = 7, "q5_1", 32, 24, true;
    Q8_0 = 8, "q8_0", 32, 34, true;
    Q8_1 = 9, "q8_1", 32, 36, true;
    Q2_K = 10, "q2_K", 256, 84, true;
    Q3_K = 11, "q3_K", 256, 110, true;
    Q4_K = 12, "q4_K", 256, 144, true;
    Q5_K = 13, "q5_K", 256, 176, true;
    Q6_K = 14, "q6_K", 256, 210, true;
    Q8_K = 15, "q8_K", 256, 292, true;
    IQ2_XXS = 16, "iq2_xxs", 256, 66, true;
    IQ2_XS = 17, "iq2_xs", 256, 74, true;
    IQ3_XXS = 18, "iq3_xxs", 256, 98, true;
    IQ1_S = 19, "iq1_s", 256, 50, true;
    IQ4_NL = 20, "iq4_nl", 32, 18, true;
    IQ3_S = 21, "iq3_s", 256, 110, true;
    IQ2_S = 22, "iq2_s", 256, 82, true;
    IQ4_XS = 23, "iq4_xs", 256, 136, true;
    I8 = 24, "i8", 1, 1, false;
    I16 = 25, "i16", 1, 2, false;
    I32 = 26, "i32", 1, 4, false;
    I64 = 27, "i64", 1, 8, false;
    F64 = 28, "f64", 1, 8, false;
    IQ1_M = 29, "iq1_m", 256, 56, true;
    BF16 = 30, "bf16", 1, 2, false;
    TQ1_0 = 34, "tq1_0", 256, 54, true;
    TQ2_0 = 35, "tq2_0", 256, 66, true;
    MXFP4 = 39, "mxfp4", 32, 17, true;
    NVFP4 = 40, "nvfp4", 64, 36, true;
    Q1_0 = 41, "q1_0", 128, 18, true;
    Q2_0 = 42, "q2_0", 64, 18, true;
}

impl GgmlType {
    pub fn id(self) -> u32 {
        self as u32
    }
    pub fn name(self) -> &'static str {
        self.layout().name
    }
    pub fn block_size(self) -> u64 {
        self.layout().block_size
    }
    pub fn type_size(self) -> u64 {
        self.layout().type_size
    }
    pub fn is_quantized(self) -> bool {
        self.layout().is_quantized
    }

    /// Parse a ggml type name, case-insensitively (`q4_k`, `Q4_K`, `bf16`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TYPE_TABLE
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
            .map(|t| t.ty)
    }

    /// Bytes needed for a row of `n` values, or `None` if `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let l = self.layout();
        if !n.is_multiple_of(l.block_size) {
            return None;
        }
        (n / l.block_size).checked_mul(l.type_size)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, t) in TYPE_TABLE.iter().enumerate() {
            assert_eq!(GgmlType::from_id(t.ty.id()), Some(t.ty));
            assert_eq!(t.ty.layout(), t);
            assert_eq!(GgmlType::from_name(t.name), Some(t.ty));
            if i > 0 {
                assert!(TYPE_TABLE[i - 1].ty.id() < t.ty.id(), "table must be in id order");
            }
        }
        // Removed ids (Q4_2, Q4_3, the interleaved Q4_0_x_y / IQ4_NL_x_y) are unknown.
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(id), None);
        }
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(576), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
    }
}
