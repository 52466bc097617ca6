//! Route paths (OpenAI's and the operational ones).

pub const CHAT_COMPLETIONS: &str = "/v1/chat/completions";
pub const COMPLETIONS: &str = "/v1/completions";
pub const EMBEDDINGS: &str = "/v1/embeddings";
pub const MODELS: &str = "/v1/models";
pub const MODEL: &str = "/v1/models/{id}";
pub const RESPONSES: &str = "/v1/responses";
pub const RESPONSE: &str = "/v1/responses/{id}";
pub const MESSAGES: &str = "/v1/messages";
pub const COUNT_TOKENS: &str = "/v1/messages/count_tokens";
/// OpenAI's Responses input-token count, and llama-server's for chat completions.
pub const RESPONSE_INPUT_TOKENS: &str = "/v1/responses/input_tokens";
pub const CHAT_INPUT_TOKENS: &str = "/v1/chat/completions/input_tokens";
pub const TOKENIZE: &str = "/tokenize";
pub const DETOKENIZE: &str = "/detokenize";
pub const HEALTH: &str = "/health";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
