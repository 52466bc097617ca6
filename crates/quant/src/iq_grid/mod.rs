//! The lattice-codebook ("i-quant") types: groups of 8 (or 4) weights are coded as an index into a
//! fixed grid of points plus signs and a block scale. IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M share
//! the grids set up by ggml's `iq2xs_init_impl`; IQ3_XXS and IQ3_S those of `iq3xs_init_impl`.

pub mod iq1;
pub mod iq2;
pub mod iq3;

mod grids2;
mod grids3;
mod init2;
mod init3;
mod simd;

use crate::Codec;

pub(crate) const CODECS: &[&[Codec]] = &[iq2::CODECS, iq1::CODECS, iq3::CODECS];
