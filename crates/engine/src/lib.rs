//! hf2q's runtime. So far: discovery of the compute devices the backends will run on.

pub mod device;
