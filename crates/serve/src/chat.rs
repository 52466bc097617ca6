//! Chat requests: validation, the template (tools, the final-message continuation), tokens — the
//! pipeline chat completions, the Responses API and the Messages API share — and the routes that
//! stop at the prompt (`/apply-template`, `/v1/chat/completions/input_tokens`).

use super::*;

/// `POST /v1/chat/completions/input_tokens` (llama-server's): the prompt's tokens for a chat request
/// as the model would see it (template, tools and all), without generating.
pub(crate) async fn chat_input_tokens(State(st): State<Shared>, body: Bytes) -> Response {
    let r = async {
        let b = api::object(&body)?;
        ensure_loaded(&st, b.get("model").and_then(Value::as_str)).await?;
        let p = prepare_chat(&st, &b)?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": p.prompt.len()})).into_response())
    };
    r.await.unwrap_or_else(|e| e.into_response())
}

/// `POST /apply-template` (llama-server's): the prompt a chat request renders to, as text.
pub(crate) async fn apply_template(State(st): State<Shared>, body: Bytes) -> Response {
    let r = (|| {
        let b = api::object(&body)?;
        let p = prepare_chat(&st, &b)?;
        Ok::<_, ApiError>(Json(json!({"prompt": p.rendered})).into_response())
    })();
    r.unwrap_or_else(|e| e.into_response())
}

/// A chat request (chat completions, or a Responses / Messages request translated to one):
/// validated, rendered with the model's template and tokenized.
pub(crate) fn prepare_chat(st: &AppState, b: &serde_json::Map<String, Value>) -> Result<Prepared, ApiError> {
    let v = api::common(b, true)?;
    let mut msgs = api::messages(b)?;
    let tools = tools::parse(b)?;
    if tools.as_ref().is_some_and(|t| t.forced.is_some()) && v.grammar.is_some() {
        return Err(ApiError::invalid(
            "grammar",
            "'grammar' cannot be combined with a forced tool_choice",
        ));
    }
    if tools.as_ref().is_some_and(|t| t.forced.is_some()) && v.format.is_some() {
        return Err(ApiError::invalid(
            "response_format",
            "response_format cannot be combined with a forced tool_choice",
        ));
    }
    let w = worker(st, v.model.as_deref())?;
    let tpl = w
        .model
        .template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request(format!("the model {} has no chat template", w.id)))?;
    let mut kwargs = serde_json::Map::new();
    if let Some(Value::Object(k)) = b.get("chat_template_kwargs") {
        kwargs = k.clone();
    }
    let mut template_tools = None;
    let tool_format = tools::ToolFormat::of_template(tpl.source());
    match &tools {
        Some(t) if tool_format.is_some() => template_tools = Some(&t.tools),
        Some(t) => tools::inline_tools(&mut msgs, t),
        // A tool round trip's follow-up often comes without `tools`: a template that knows no
        // tools still gets the earlier calls and results as text.
        None if tool_format.is_none() => tools::inline_history(&mut msgs),
        None => {}
    }
    if tool_format.is_some() {
        tools::arguments_as_objects(&mut msgs);
    }
    tools::empty_call_content(&mut msgs);
    let tool_format = tool_format.unwrap_or(tools::ToolFormat::Hermes);
    // llama-server joins the text parts of an assistant message it continues with a blank line.
    let raw_last = b.get("messages").and_then(Value::as_array).and_then(|a| a.last());
    if let (Some(m), Some(Value::Array(parts))) = (msgs.last_mut(), raw_last.and_then(|m| m.get("content"))) {
        if m.role == "assistant" {
            if let Ok(t) = api::text_parts(parts, "\n\n") {
                m.content = Value::String(t);
            }
        }
    }
    let (add_generation_prompt, continued) = continue_final(b, &msgs)?;
    let mut text = tpl
        .render(&msgs, template_tools, add_generation_prompt, &kwargs)
        .map_err(|e| template_error(tpl, &msgs, template_tools, &kwargs, e))?;
    if let Some(prefix) = &continued {
        // transformers' continue_final_message: the prompt ends where the final message's text
        // ends (the template's end-of-turn after it is cut off), so the model writes on.
        let at = text
            .rfind(prefix.as_str())
            .map(|i| i + prefix.len())
            .or_else(|| text.rfind(prefix.trim()).map(|i| i + prefix.trim().len()))
            .ok_or_else(|| {
                ApiError::invalid(
                    "messages",
                    "the final assistant message cannot be continued: the chat template does not \
                     render its text as given",
                )
            })?;
        text.truncate(at);
    }
    let mut prompt = w
        .model
        .tokenizer
        .encode(&text, true, true)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(bos) = w.model.tokenizer.bos() {
        if prompt.len() >= 2 && prompt[0] == bos && prompt[1] == bos {
            prompt.remove(0);
        }
    }
    let thinks = reasoning::template_markers(tpl.source()).map(|m| (m, reasoning::prompt_opens(&text, m)));
    let mut p = prepare(w, prompt, v)?;
    p.reasoning = thinks;
    p.rendered = text;
    if let Some(t) = &tools {
        p.tools = true;
        p.tools_parallel = t.parallel;
        if let Some(mut g) = tools::forced_grammar(t, tool_format) {
            // A prompt that opens a reasoning block (thinking on): the forced call comes once it
            // is closed, empty.
            if let Some((m, true)) = thinks {
                g = tools::after_reasoning(&g, m.close);
            }
            p.grammar = Some(g);
        }
        p.tool_format = tool_format;
    }
    Ok(p)
}

/// Whether the template adds the generation prompt, and whether the reply continues the final
/// assistant message (its text, when it does): vLLM's
/// `continue_final_message` (with `add_generation_prompt`, which it excludes), and, when neither
/// is given, llama-server's assistant prefill (as Anthropic's Messages API prefills): a final
/// assistant message with text and no tool calls is continued.
fn continue_final(
    b: &serde_json::Map<String, Value>,
    msgs: &[engine::chat::ChatMessage],
) -> Result<(bool, Option<String>), ApiError> {
    let flag = |k: &str| -> Result<Option<bool>, ApiError> {
        match b.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(x)) => Ok(Some(*x)),
            Some(_) => Err(ApiError::invalid(k, format!("'{k}' must be a boolean"))),
        }
    };
    let (add, cont) = (flag("add_generation_prompt")?, flag("continue_final_message")?);
    if add == Some(true) && cont == Some(true) {
        return Err(ApiError::invalid(
            "continue_final_message",
            "'continue_final_message' and 'add_generation_prompt' cannot both be true",
        ));
    }
    let last = msgs
        .last()
        .filter(|m| m.role == "assistant" && !m.extra.contains_key("tool_calls"));
    let text = last.map(|m| match &m.content {
        Value::String(t) => t.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<String>(),
        _ => String::new(),
    });
    match (cont, add) {
        (Some(true), _) => match text {
            Some(t) if !t.is_empty() => Ok((false, Some(t))),
            _ => Err(ApiError::invalid(
                "continue_final_message",
                "'continue_final_message' needs a final assistant message with text",
            )),
        },
        (None, None) => match text.filter(|t| !t.is_empty()) {
            // As llama-server: which of two trailing assistant messages would be continued is
            // ambiguous.
            Some(_) if msgs.len() >= 2 && msgs[msgs.len() - 2].role == "assistant" => Err(ApiError::invalid(
                "messages",
                format!(
                    "messages {} and {} are both assistant messages at the end of the conversation: \
                     only the final one can be continued (merge them, or send add_generation_prompt: true)",
                    msgs.len() - 2,
                    msgs.len() - 1
                ),
            )),
            Some(t) => Ok((false, Some(t))),
            None => Ok((true, None)),
        },
        (_, add) => Ok((add.unwrap_or(true), None)),
    }
}

/// A 400 for a chat template that failed, naming the first message whose rendering fails (found
/// by rendering ever longer prefixes of the conversation) and the template line.
pub(crate) fn template_error(
    tpl: &engine::chat::ChatTemplate,
    msgs: &[engine::chat::ChatMessage],
    tools: Option<&Value>,
    kwargs: &serde_json::Map<String, Value>,
    e: engine::chat::ChatError,
) -> ApiError {
    let at = (1..=msgs.len())
        .find(|&k| tpl.render(&msgs[..k], tools, false, kwargs).is_err())
        .map(|k| format!(" at message {} (role {:?})", k - 1, msgs[k - 1].role))
        .unwrap_or_default();
    ApiError::invalid("messages", format!("the chat template failed{at}: {e}"))
}
