//! Chat templates rendered by minijinja against transformers' jinja2 rendering
//! (`data/chat_expected.json`, made by `data/make_chat_expected.py`): SmolLM2's template and the
//! tiny qwen3 fixture's (tools, tool calls, enable_thinking).

use engine::chat::{strftime, ChatError, ChatMessage, ChatTemplate};
use engine::tokenizer::Tokenizer;
use gguf::GgufFile;
use serde_json::{json, Map, Value as J};
use std::path::PathBuf;

fn expected() -> J {
    serde_json::from_str(include_str!("data/chat_expected.json")).expect("expected JSON")
}

fn message(v: &J) -> ChatMessage {
    let mut extra = v.as_object().unwrap().clone();
    let role = extra.remove("role").unwrap().as_str().unwrap().to_string();
    let content = extra.remove("content").unwrap_or(J::Null);
    ChatMessage { role, content, extra }
}

#[test]
fn templates_render_like_transformers() {
    let e = expected();
    let bos = e["bos"].as_str().unwrap();
    let eos = e["eos"].as_str().unwrap();
    for case in e["cases"].as_array().unwrap() {
        let source = e["templates"][case["template"].as_str().unwrap()].as_str().unwrap();
        let tmpl = ChatTemplate::new(source, bos, eos).unwrap();
        let messages: Vec<ChatMessage> = case["messages"].as_array().unwrap().iter().map(message).collect();
        let tools = (!case["tools"].is_null()).then_some(&case["tools"]);
        let kwargs = case["kwargs"].as_object().unwrap();
        let got = tmpl
            .render(
                &messages,
                tools,
                case["add_generation_prompt"].as_bool().unwrap(),
                kwargs,
            )
            .unwrap_or_else(|err| panic!("{}: {err}", case["name"]));
        assert_eq!(got, case["expected"].as_str().unwrap(), "{}", case["name"]);
    }
}

#[test]
fn smollm2_template_from_gguf() {
    let dir = std::env::var_os("HF2Q_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hf2q/models"));
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-models first",
        p.display()
    );
    let f = GgufFile::open(&p).unwrap();
    let tok = Tokenizer::from_gguf(f.metadata()).unwrap();
    let tmpl = ChatTemplate::from_gguf(f.metadata(), &tok)
        .unwrap()
        .expect("SmolLM2 has a template");
    let e = expected();
    let case = &e["cases"][0];
    let messages: Vec<ChatMessage> = case["messages"].as_array().unwrap().iter().map(message).collect();
    assert_eq!(
        tmpl.render(&messages, None, true, &Map::new()).unwrap(),
        case["expected"].as_str().unwrap()
    );

    let mut meta = f.metadata().clone();
    meta.remove("tokenizer.chat_template");
    assert!(ChatTemplate::from_gguf(&meta, &tok).unwrap().is_none());
}

#[test]
fn python_methods_loop_controls_and_namespace() {
    let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}\
{% set ns.n = ns.n + 1 %}{{ m.content.strip().upper() }}|{{ m.content.startswith(' a') }}|{{ m.content.split(',') | length }}\
{% if loop.index > 5 %}{% break %}{% endif %};{% endfor %}{{ ns.n }}{{ bos_token }}{{ eos_token }}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let msgs = [
        ChatMessage::new("user", " a,b "),
        ChatMessage::new("skip", "x"),
        ChatMessage::new("user", "c"),
    ];
    assert_eq!(
        t.render(&msgs, None, false, &Map::new()).unwrap(),
        "A,B|True|2;C|False|1;2<s></s>"
    );
}

#[test]
fn tojson_matches_python_json_dumps() {
    let t = ChatTemplate::new("{{ x | tojson }}\n{{ x | tojson(indent=2) }}\n{{ y | tojson }}", "", "").unwrap();
    let mut kw = Map::new();
    kw.insert("x".into(), json!({"b": [1, 2.5, null, true], "a": "é<&>\"\n"}));
    kw.insert("y".into(), json!([]));
    let got = t.render(&[], None, false, &kw).unwrap();
    assert_eq!(
        got,
        "{\"b\": [1, 2.5, null, true], \"a\": \"é<&>\\\"\\n\"}\n{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"é<&>\\\"\\n\"\n}\n[]"
    );
}

#[test]
fn raise_exception_and_syntax_errors_name_the_line() {
    let t = ChatTemplate::new(
        "line one\n{% if messages | length == 0 %}{{ raise_exception('need a message') }}{% endif %}",
        "",
        "",
    )
    .unwrap();
    match t.render(&[], None, false, &Map::new()) {
        Err(ChatError::Raised { line, message }) => {
            assert_eq!(message, "need a message");
            assert_eq!(line, Some(2));
        }
        other => panic!("expected Raised, got {other:?}"),
    }
    let err = ChatTemplate::new("ok\n\n{% for x in %}", "", "").unwrap_err();
    assert!(matches!(err, ChatError::Syntax { line: Some(3), .. }), "{err:?}");
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn strftime_formats_like_python() {
    // 2024-02-29 13:05:09 UTC, a Thursday.
    let t = 1_709_211_909;
    assert_eq!(strftime(t, "%d %b %Y"), "29 Feb 2024");
    assert_eq!(
        strftime(t, "%A %B %-d, %Y %H:%M:%S %j %y"),
        "Thursday February 29, 2024 13:05:09 060 24"
    );
    assert_eq!(strftime(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year: i32 = t.render(&[], None, false, &Map::new()).unwrap().parse().unwrap();
    assert!(year >= 2024);
}
