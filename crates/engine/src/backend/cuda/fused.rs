//! The launch-saving variants of the CUDA backend (`Cuda::with_fused`, `Cuda::fused`): which
//! launches do another's work too, and the environment variables that turn each on or off.

/// Launches that do another's work too, so that a decode step has fewer launches
/// (`Cuda::with_fused`, `Cuda::fused`): the first four in the last of their blocks to finish
/// (counted through a device counter that it sets back to 0), `GluDown`, `SumNorm`, `RouteIn`
/// and `RopeAttn` in every block.
#[derive(Clone, Copy, Debug)]
pub enum Fused {
    /// Decode attention (`attn_dec_f16`) whose last block of each (row, KV head) merges the
    /// splits, and quantizes them for the integer product that follows (no `attn_combine(_q8)`).
    AttnMerge,
    /// A MoE router's product (float weights) that routes its rows (no `moe_route`).
    Route,
    /// MoE gate / up products that make the GLU for the down products (no `glu_q8`).
    Glu,
    /// The fused FFN input that also does the residual add before it (no `binary`).
    Add,
    /// MoE down products whose blocks each make their pair's GLU, quantized, in shared memory
    /// (no `glu_q8`; no counter: every block of a pair makes the same few hundred values).
    GluDown,
    /// A residual add and norm whose addend is the MoE combine recorded just before it: the
    /// combine made in the norm's launch (no `weighted_sum_rows`; no counter).
    SumNorm,
    /// MoE gate / up and down products whose blocks route their pair's row themselves from the
    /// router's logits (no `moe_route`; with the down products making the GLU, as `GluDown`).
    RouteIn,
    /// Decode attention (`attn_dec_f16_rope`, a step whose sequences have one row each) that does
    /// the q / k norms, the rope and the KV store of the `rope_store_kv` recorded just before it
    /// (no `rope_store_kv`; no counter).
    RopeAttn,
}

impl Fused {
    pub const ALL: [Fused; 8] = [
        Fused::AttnMerge,
        Fused::Route,
        Fused::Glu,
        Fused::Add,
        Fused::GluDown,
        Fused::SumNorm,
        Fused::RouteIn,
        Fused::RopeAttn,
    ];

    /// On unless its variable says 0: `SumNorm` (MoE tg128 1.012× on an H100,
    /// bench/runs/2026-12-05-h100-b) and `RopeAttn` (tg128 on an H200: MoE 1.014×, 8B Q4_K_M
    /// 1.014×, BF16 1.006×, bench/runs/2026-12-05-h200); the others are off unless it says 1.
    pub fn default_on(self) -> bool {
        matches!(self, Fused::SumNorm | Fused::RopeAttn)
    }

    /// The environment variable that turns it on (`=1`) or off (`=0`).
    pub fn var(self) -> &'static str {
        match self {
            Fused::AttnMerge => "HF2Q_CUDA_ATTN_MERGE",
            Fused::Route => "HF2Q_CUDA_ROUTE_FUSE",
            Fused::Glu => "HF2Q_CUDA_GLU_FUSE",
            Fused::Add => "HF2Q_CUDA_ADD_FUSE",
            Fused::GluDown => "HF2Q_CUDA_GLU_DOWN",
            Fused::SumNorm => "HF2Q_CUDA_SUM_NORM",
            Fused::RouteIn => "HF2Q_CUDA_ROUTE_IN",
            Fused::RopeAttn => "HF2Q_CUDA_ROPE_ATTN",
        }
    }
}
