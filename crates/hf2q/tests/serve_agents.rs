//! The clients agents and frameworks use, unmodified, against `hf2q serve`: the official OpenAI
//! (Python and Node) and Anthropic SDKs, LangChain, llama.cpp's own server test suite, and bad
//! input on the agents' routes.

mod common;

use common::server::Server;
use common::smollm2;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

/// Run a client script of tests/ (`python3` or `node`) with `args`; it must exit 0.
fn run_client(interpreter: &str, script: &str, args: &[&str], env: &[(&str, std::ffi::OsString)]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let mut cmd = Command::new(interpreter);
    cmd.arg(&path).args(args).env("NO_PROXY", "*");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {interpreter} (.ci/run installs it): {e}"));
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The official `openai` Python package (PyPI, unmodified) against the server: models, chat
/// unary and streamed, tools (forced, streamed, round trip), json_schema output, completions and
/// the SDK's error classes (tests/openai_sdk.py has the checks).
#[test]
fn official_openai_python_sdk() {
    let s = Server::start(&["--api-key", "sdk-key", "--parallel", "2"]);
    let model = smollm2().file_stem().unwrap().to_string_lossy().into_owned();
    let base = format!("http://{}/v1", s.addr);
    run_client(
        "python3",
        "openai_sdk.py",
        &[&base, "sdk-key", &model],
        &[("PYTHONPATH", common::pylib().into())],
    );
}

/// The agents' APIs through the official SDKs (PyPI, unmodified): the `openai` package's
/// `client.responses` and the `anthropic` package's `client.messages` give the same greedy text as
/// chat completions for the same conversation, streamed and not, with tools, structured output,
/// stored responses and count_tokens (tests/agent_sdks.py has the checks).
#[test]
fn official_agent_sdks() {
    let s = Server::start(&["--api-key", "sdk-key", "--parallel", "2"]);
    let model = smollm2().file_stem().unwrap().to_string_lossy().into_owned();
    run_client(
        "python3",
        "agent_sdks.py",
        &[&s.addr, "sdk-key", &model],
        &[("PYTHONPATH", common::pylib().into())],
    );
}

/// Bad input on the agents' routes is an API-shaped 4xx naming the field, never a 5xx: malformed
/// items, unknown item and block types, tool results without their call, wrong types, oversized
/// prompts; Anthropic's errors in its own shape, and its `x-api-key` header accepted.
#[test]
fn agent_routes_refuse_bad_input_by_name() {
    let s = Server::start(&["--api-key", "k", "-c", "512"]);
    let responses: &[(Value, &str)] = &[
        (json!({"input": 7}), "input"),
        (json!({}), "input"),
        (json!({"input": [{"type": "bogus"}]}), "input[0].type"),
        (json!({"input": [{"role": "robot", "content": "x"}]}), "input[0]"),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"}]}),
            "input[0]",
        ),
        (json!({"input": "hi", "tools": [{"type": "file_search"}]}), "tools"),
        (json!({"input": "hi", "max_output_tokens": -1}), "max_output_tokens"),
        (
            json!({"input": "hi", "text": {"format": {"type": "xml"}}}),
            "text.format",
        ),
        (
            json!({"input": "hi", "previous_response_id": "resp_missing"}),
            "previous_response_id",
        ),
        (json!({"input": "hi", "temperature": "hot"}), "temperature"),
        (json!({"input": "word ".repeat(2000)}), ""),
    ];
    for (body, param) in responses {
        let (st, _, b) = s.request("POST", "/v1/responses", Some(&body.to_string()), Some("k"));
        let r: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
        assert_eq!(st, 400, "{body} → {b}");
        if !param.is_empty() {
            assert_eq!(r["error"]["param"].as_str(), Some(*param), "{body} → {r}");
        }
    }
    let msgs: &[(Value, &str)] = &[
        (json!({"messages": [{"role": "user", "content": "hi"}]}), "max_tokens"),
        (json!({"max_tokens": 8, "messages": []}), "messages"),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]}),
            "tool_use_id",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "sometimes"}}),
            "tool_choice",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": "END"}),
            "stop_sequences",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "word ".repeat(2000)}]}),
            "context",
        ),
    ];
    for (body, needle) in msgs {
        let raw = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            body.to_string().len(),
            body
        );
        let (st, _, b) = common::server::split_response(&s.raw(raw.as_bytes(), std::time::Duration::from_secs(60)));
        let r: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
        assert_eq!(st, 400, "{body} → {b}");
        assert_eq!(r["type"], "error", "{r}");
        assert_eq!(r["error"]["type"], "invalid_request_error", "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap_or("").contains(needle),
            "{body} → {r}"
        );
    }
    // Malformed JSON, a wrong key, an unknown stored response.
    let (st, _, b) = s.request("POST", "/v1/messages", Some("{not json"), Some("k"));
    assert_eq!(st, 400, "{b}");
    let (st, _, b) = s.request("POST", "/v1/messages", Some("{}"), Some("wrong"));
    let r: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (st, r["error"]["type"].as_str()),
        (401, Some("authentication_error")),
        "{b}"
    );
    let (st, _, _) = s.request("GET", "/v1/responses/resp_nope", None, Some("k"));
    assert_eq!(st, 404);
    let (st, _, _) = s.request("DELETE", "/v1/responses/resp_nope", None, Some("k"));
    assert_eq!(st, 404);
    // llama-server's routes without the /v1 prefix.
    let (st, _, b) = s.request("GET", "/models", None, Some("k"));
    assert_eq!(st, 200, "{b}");
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (st, _, b) = s.request("POST", "/chat/completions", Some(&chat.to_string()), Some("k"));
    assert_eq!(st, 200, "{b}");
}

/// The official `openai` Node SDK (npm, unmodified): `client.responses` unary and streamed, a tool
/// round trip, json_schema, previous_response_id, error classes (tests/openai_node.cjs has the
/// checks). Needs `node`, which `.ci/run` installs, and the SDK from `scripts/fetch-models`.
#[test]
fn official_openai_node_sdk() {
    let nodelib = common::models_dir().join("nodelib/node_modules");
    assert!(
        nodelib.join("openai").is_dir(),
        "{} is missing: run scripts/fetch-models (it needs node and npm)",
        nodelib.display()
    );
    let s = Server::start(&["--api-key", "sdk-key", "--parallel", "2"]);
    let model = smollm2().file_stem().unwrap().to_string_lossy().into_owned();
    let base = format!("http://{}/v1", s.addr);
    run_client(
        "node",
        "openai_node.cjs",
        &[&base, "sdk-key", &model],
        &[("NODE_PATH", nodelib.into())],
    );
}

/// llama.cpp b11434's own server tests (tools/server/tests, its OpenAI- and Anthropic-compatible
/// modules, unmodified) against `hf2q serve` through tests/llama_server/utils.py; every failure
/// must be one listed in tests/llama_server/expected_failures.txt with its reason, and a listed
/// test that passes fails this test too (the list stays exact).
#[test]
fn llama_cpp_server_tests() {
    let suite = common::models_dir().join("llama-server-tests");
    assert!(
        suite.join("unit/test_chat_completion.py").is_file(),
        "{} is missing: run scripts/fetch-models first",
        suite.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let minilm = common::server::minilm_gguf(tmp.path());
    let runner = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/llama_server/run.py");
    let out = Command::new("python3")
        .arg(&runner)
        .arg(&suite)
        .env("HF2Q_BIN", common::server::bin())
        .env("HF2Q_CHAT_MODEL", smollm2())
        .env("HF2Q_EMBED_MODEL", &minilm)
        .env("PYTHONPATH", common::pylib())
        .env("NO_PROXY", "*")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .filter(|l| l.starts_with("llama.cpp server tests") || l.contains("UNEXPECTED") || l.contains("NOW PASSES"));
    for l in summary {
        eprintln!("{l}");
    }
    assert!(
        out.status.success(),
        "llama.cpp server tests:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// LangChain's `ChatOpenAI(base_url=…)` (PyPI langchain-openai, unmodified): invoke, stream,
/// `.bind_tools()` and `.with_structured_output()` (tests/langchain_check.py has the checks).
#[test]
fn langchain_chat_openai() {
    let s = Server::start(&["--api-key", "sdk-key"]);
    let model = smollm2().file_stem().unwrap().to_string_lossy().into_owned();
    let base = format!("http://{}/v1", s.addr);
    let env = [
        ("PYTHONPATH", common::pylib().into()),
        ("LANGCHAIN_TRACING_V2", "false".into()),
    ];
    run_client("python3", "langchain_check.py", &[&base, "sdk-key", &model], &env);
}
