//! Route paths (OpenAI's and the operational ones).

pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";
pub const COMPLETIONS: &str = "/v1/completions";
pub const EMBEDDINGS: &str = "/v1/embeddings";
pub const MODELS: &str = "/v1/models";
pub const MODEL: &str = "/v1/models/{id}";
pub const TOKENIZE: &str = "/tokenize";
pub const DETOKENIZE: &str = "/detokenize";
pub const HEALTH: &str = "/health";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
