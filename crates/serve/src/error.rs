//! One error type for every route, rendered as OpenAI's error object with the matching status.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
    pub message: String,
    /// More fields of the error object (llama-server's `n_prompt_tokens` / `n_ctx`).
    pub extra: Vec<(&'static str, serde_json::Value)>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            code: None,
            param: None,
            message: message.into(),
            extra: Vec::new(),
        }
    }
    /// A prompt longer than the context: OpenAI's code `context_length_exceeded`, with
    /// llama-server's error type and its `n_prompt_tokens` / `n_ctx` fields, which clients of
    /// either read to shorten the conversation.
    pub fn context_exceeded(message: impl Into<String>, n_prompt: usize, n_ctx: usize) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "exceed_context_size_error", message)
            .with_code("context_length_exceeded");
        e.extra = vec![("n_prompt_tokens", n_prompt.into()), ("n_ctx", n_ctx.into())];
        e
    }
    /// 400 invalid_request_error, naming the offending field.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message).with_code("model_not_found")
    }
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or invalid API key (send it as `Authorization: Bearer KEY` or `x-api-key: KEY`)",
        )
        .with_code("invalid_api_key")
    }
    pub fn busy() -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the request queue is full; retry shortly",
        )
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        let mut b = serde_json::json!({
            "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code }
        });
        for (k, v) in &self.extra {
            b["error"][*k] = v.clone();
        }
        b
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS || self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
        }
        r
    }
}

impl From<engine::EngineError> for ApiError {
    fn from(e: engine::EngineError) -> ApiError {
        match e {
            engine::EngineError::ContextFull { .. } => {
                ApiError::bad_request(e.to_string()).with_code("context_length_exceeded")
            }
            e if e.is_input() => ApiError::bad_request(e.to_string()),
            e => ApiError::internal(e.to_string()),
        }
    }
}
