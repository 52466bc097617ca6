//! `hf2q serve`'s chat templating on the real SmolLM2 model: a final assistant message continued
//! (prefill, `continue_final_message`), prompt token counts (`/v1/responses/input_tokens`,
//! `/v1/chat/completions/input_tokens`), `--chat-template-file` and the `__verbose` debug object,
//! and llama-server's extensions (built-in templates, `--seed`, timings, prompt progress).

mod common;

use common::server::Server;
use common::smollm2;
use serde_json::json;
use std::process::Command;

/// A final assistant message is continued (llama-server's assistant prefill, vLLM's
/// `continue_final_message`, Anthropic's prefill): the prompt ends with its text, no end of turn,
/// and the reply is what `/v1/completions` writes after that prompt. `add_generation_prompt: true`
/// answers it with a new turn instead (as OpenAI and the Responses API do); both flags true, or
/// `continue_final_message` without a final assistant message, are 400s naming the field.
#[test]
fn final_assistant_messages_are_continued() {
    let s = Server::start(&[]);
    let msgs = json!([
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "The answer is"}
    ]);
    let (st, r) = s.json("POST", "/apply-template", json!({"messages": msgs}), None);
    assert_eq!(st, 200, "{r}");
    let prompt = r["prompt"].as_str().unwrap().to_string();
    assert!(prompt.ends_with("<|im_start|>assistant\nThe answer is"), "{prompt:?}");
    let (st, r) = s.json(
        "POST",
        "/apply-template",
        json!({"messages": msgs, "continue_final_message": true, "add_generation_prompt": false}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        r["prompt"].as_str(),
        Some(prompt.as_str()),
        "the explicit form renders the same"
    );
    let (st, r) = s.json(
        "POST",
        "/apply-template",
        json!({"messages": msgs, "add_generation_prompt": true}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert!(
        r["prompt"]
            .as_str()
            .unwrap()
            .ends_with("The answer is<|im_end|>\n<|im_start|>assistant\n"),
        "{r}"
    );

    let (st, chat) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 8, "temperature": 0}),
        None,
    );
    assert_eq!(st, 200, "{chat}");
    let (st, comp) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 8, "temperature": 0}),
        None,
    );
    assert_eq!(st, 200, "{comp}");
    let text = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    assert_eq!(Some(text), comp["choices"][0]["text"].as_str(), "the continuation");
    let (st, m) = s.json(
        "POST",
        "/v1/messages",
        json!({"model": "m", "max_tokens": 8, "temperature": 0, "messages": msgs}),
        None,
    );
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["content"][0]["text"].as_str(), Some(text), "Anthropic's prefill");

    for (body, field) in [
        (
            json!({"messages": msgs, "continue_final_message": true, "add_generation_prompt": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": msgs, "add_generation_prompt": "yes"}),
            "add_generation_prompt",
        ),
    ] {
        let (st, r) = s.json("POST", "/v1/chat/completions", body, None);
        assert_eq!(st, 400, "{r}");
        assert_eq!(r["error"]["param"], field, "{r}");
    }
}

/// `POST /v1/responses/input_tokens` (OpenAI) and `/v1/chat/completions/input_tokens`
/// (llama-server) count the prompt exactly as the request would send it: the same number as the
/// usage of the request itself, instructions, tools and `previous_response_id` included.
#[test]
fn input_token_counts_match_usage() {
    let s = Server::start(&[]);
    let chat = json!({"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}],
        "max_tokens": 2, "temperature": 0});
    let (st, n) = s.json("POST", "/v1/chat/completions/input_tokens", chat.clone(), None);
    assert_eq!(st, 200, "{n}");
    let (st, r) = s.json("POST", "/v1/chat/completions", chat.clone(), None);
    assert_eq!(st, 200, "{r}");
    assert_eq!(n["input_tokens"], r["usage"]["prompt_tokens"]);
    let (st, n2) = s.json("POST", "/chat/completions/input_tokens", chat, None);
    assert_eq!((st, &n2["input_tokens"]), (200, &n["input_tokens"]));

    let tool = json!({"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    let body = json!({"model": "m", "instructions": "Be brief.", "input": "What is 2 + 3?", "tools": [tool],
        "max_output_tokens": 4, "temperature": 0});
    let (st, n) = s.json("POST", "/v1/responses/input_tokens", body.clone(), None);
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["object"], "response.input_tokens");
    let (st, r) = s.json("POST", "/v1/responses", body, None);
    assert_eq!(st, 200, "{r}");
    assert_eq!(n["input_tokens"], r["usage"]["input_tokens"]);
    let follow = json!({"model": "m", "previous_response_id": r["id"], "input": "And 3 + 4?", "max_output_tokens": 4,
        "temperature": 0});
    let (st, n) = s.json("POST", "/v1/responses/input_tokens", follow.clone(), None);
    assert_eq!(st, 200, "{n}");
    let (_, r2) = s.json("POST", "/v1/responses", follow, None);
    assert_eq!(n["input_tokens"], r2["usage"]["input_tokens"]);
    let (st, e) = s.json(
        "POST",
        "/v1/responses/input_tokens",
        json!({"model": "m", "previous_response_id": "resp_nope", "input": "x"}),
        None,
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "previous_response_id");
}

/// `--chat-template-file` renders every chat request with the given template instead of the
/// model's; a malformed one stops the server at start (exit 3, naming the file). `"verbose": true`
/// (or `--debug-responses`) adds llama-server's `__verbose` object with the rendered prompt.
#[test]
fn chat_template_file_and_verbose_replies() {
    let tmp = tempfile::tempdir().unwrap();
    let tpl = tmp.path().join("t.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}",
    )
    .unwrap();
    let s = Server::start_with(&[smollm2()], &["--chat-template-file", tpl.to_str().unwrap()]);
    let msgs = json!([{"role": "user", "content": "What is 2 + 3?"}]);
    let (st, r) = s.json("POST", "/apply-template", json!({"messages": msgs}), None);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["prompt"], "[user] What is 2 + 3?\n[assistant] ");
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 2, "temperature": 0, "verbose": true}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["__verbose"]["prompt"], "[user] What is 2 + 3?\n[assistant] ");
    let (_, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 2}),
        None,
    );
    assert!(r.get("__verbose").is_none(), "only when asked: {r}");
    drop(s);

    std::fs::write(&tpl, "{% for m in messages %}{{ m.content }").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .args([
            "serve",
            "-m",
            smollm2().to_str().unwrap(),
            "--chat-template-file",
            tpl.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("--chat-template-file") && err.contains("t.jinja"), "{err}");
}

fn sse_chunks(body: &str) -> Vec<serde_json::Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("not JSON: {e}")))
        .collect()
}

/// llama-server's behaviours that its clients and its test suite read: `--chat-template NAME`
/// (a built-in format) and an unknown name refused listing the names; `--seed` making requests
/// without a seed reproducible; `timings` in replies, in every chunk with `timings_per_token`;
/// `prompt_progress` chunks with `return_progress` (cut by `--batch-size`); the too-long-prompt
/// error with `n_prompt_tokens` / `n_ctx`; two trailing assistant messages refused.
#[test]
fn llama_server_extensions() {
    let s = Server::start(&[
        "--chat-template",
        "llama3",
        "--seed",
        "7",
        "--batch-size",
        "16",
        "-c",
        "256",
    ]);
    let msgs = json!([{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]);
    let (st, r) = s.json("POST", "/apply-template", json!({"messages": msgs}), None);
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        r["prompt"],
        "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\
         What is the best book<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // No seed and temperature 1: the server's seed makes the two replies equal.
    let req = json!({"messages": msgs, "max_tokens": 12, "temperature": 1.0});
    let (_, a) = s.json("POST", "/v1/chat/completions", req.clone(), None);
    let (_, b) = s.json("POST", "/v1/chat/completions", req, None);
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
    let t = &a["timings"];
    assert_eq!(t["predicted_n"], a["usage"]["completion_tokens"], "{a}");
    assert!(
        t["prompt_n"].as_u64().unwrap() + t["cache_n"].as_u64().unwrap() > 0,
        "{a}"
    );
    assert!(t["predicted_per_second"].as_f64().unwrap() > 0.0, "{a}");

    let body = json!({"messages": msgs, "max_tokens": 6, "stream": true, "timings_per_token": true,
                      "return_progress": true, "temperature": 0});
    let (st, _, text) = s.request("POST", "/v1/chat/completions", Some(&body.to_string()), None);
    assert_eq!(st, 200);
    let chunks = sse_chunks(&text);
    assert!(chunks[0]["choices"][0]["delta"]["content"].is_null(), "{}", chunks[0]);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let progress: Vec<_> = chunks.iter().filter_map(|c| c.get("prompt_progress")).collect();
    let total = progress[0]["total"].as_u64().unwrap();
    assert!(total > 16, "a prompt of more than one batch: {total}");
    assert_eq!(
        progress[0]["processed"], progress[0]["cache"],
        "the first report precedes the prefill"
    );
    assert_eq!(progress.last().unwrap()["processed"], total);
    // One report per 16-token batch after the first.
    assert_eq!(
        progress.len() as u64,
        1 + (total - progress[0]["cache"].as_u64().unwrap()).div_ceil(16)
    );
    let with_text: Vec<_> = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .collect();
    assert!(!with_text.is_empty() && with_text.iter().all(|c| c.get("timings").is_some()));

    let long = "word ".repeat(300);
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": long}]}),
        None,
    );
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["code"], "context_length_exceeded");
    assert_eq!(r["error"]["type"], "exceed_context_size_error");
    assert_eq!(r["error"]["n_ctx"], 256);
    assert!(r["error"]["n_prompt_tokens"].as_u64().unwrap() > 256, "{r}");

    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                            {"role": "assistant", "content": "b"}]}),
        None,
    );
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["param"], "messages");
    drop(s);

    let o = Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .args([
            "serve",
            "-m",
            smollm2().to_str().unwrap(),
            "--chat-template",
            "no-such-format",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("no-such-format") && err.contains("chatml") && err.contains("llama3"),
        "{err}"
    );
}

/// With a top-k cut (llama-server's `top_k`) each step reads only the top of its logits row and
/// the values of the biased and penalised tokens (`Backend::top_of_rows`, asked for the step's
/// sequences at once); with logprobs it reads the whole row: the same draws, the same text, alone
/// and beside each other in steps.
#[test]
fn top_k_sampling_reads_what_the_chain_uses() {
    let s = std::sync::Arc::new(Server::start(&["--parallel", "4"]));
    let content = |r: &serde_json::Value| {
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let topk = json!({"temperature": 0.9, "top_k": 20, "seed": 7, "max_tokens": 40,
                      "presence_penalty": 0.8, "repetition_penalty": 1.2, "logit_bias": {"13": 3.0},
                      "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let mut whole = topk.clone();
    whole["logprobs"] = json!(true);
    let (st, r) = s.json("POST", "/v1/chat/completions", topk.clone(), None);
    assert_eq!(st, 200, "{r}");
    let t = content(&r);
    assert!(!t.is_empty(), "{r}");
    assert_eq!(
        content(&s.json("POST", "/v1/chat/completions", whole.clone(), None).1),
        t
    );
    let hs: Vec<_> = [&topk, &whole, &topk, &whole]
        .into_iter()
        .map(|req| {
            let (s, req) = (s.clone(), req.clone());
            std::thread::spawn(move || content(&s.json("POST", "/v1/chat/completions", req, None).1))
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), t, "top-k cut beside other requests");
    }
}
