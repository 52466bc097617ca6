//! `general.file_type`: llama.cpp's model file types (`llama_ftype` in `include/llama.h`).

/// (id, name as llama-quantize spells it). Removed ids (4-6, 33-35) are absent.
pub const FILE_TYPES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
];

pub fn file_type_name(id: u64) -> Option<&'static str> {
    FILE_TYPES.iter().find(|(i, _)| u64::from(*i) == id).map(|(_, n)| *n)
}

pub fn file_type_id(name: &str) -> Option<u32> {
    FILE_TYPES
        .iter()
        .find(|(_, n)| n.eq_ignore_ascii_case(name))
        .map(|(i, _)| *i)
}
