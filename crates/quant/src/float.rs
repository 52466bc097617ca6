//! (not yet implemented)

use crate::Codec;

pub(crate) const CODECS: &[Codec] = &[];
