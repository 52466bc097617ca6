//! Built-in chat templates by name, for `--chat-template NAME`: the formats llama-server knows by
//! name (llama.cpp src/llama-chat.cpp, `llm_chat_apply_template`), written here as Jinja so that
//! they go through the same renderer as a model's own template. For a GGUF whose template is
//! missing or wrong.

/// Content of the message `m` as text (`none` for an assistant turn that only calls tools).
const C: &str = "{%- set c = m.content or '' %}";

/// `(name, template)`, in llama-server's order of names.
pub fn all() -> Vec<(&'static str, String)> {
    let t = |body: &str| format!("{{%- for m in messages %}}{C}{body}{{%- endfor %}}");
    let gen = |s: &str| format!("{{%- if add_generation_prompt %}}{{{{ '{s}' }}}}{{%- endif %}}");
    let role_turns = |open: &str, mid: &str, close: &str, prompt: &str| {
        t(&format!("{{{{ '{open}' + m.role + '{mid}' + c + '{close}' }}}}")) + &gen(prompt)
    };
    // llama2 family: `[INST]` turns; the system message inside `<<SYS>>` (plain text without).
    let llama2 = |sys: bool, bos: bool, strip: bool| {
        let c = if strip { "(c | trim)" } else { "c" };
        let system = if sys {
            format!("'<<SYS>>\\n' + {c} + '\\n<</SYS>>\\n\\n'")
        } else {
            format!("{c} + '\\n'")
        };
        let reopen = if bos { "<s>[INST] " } else { "[INST] " };
        format!(
            "{{%- set ns = namespace(inside=true) %}}{{{{ '[INST] ' }}}}{{%- for m in messages %}}{C}\
             {{%- if not ns.inside %}}{{%- set ns.inside = true %}}{{{{ '{reopen}' }}}}{{%- endif %}}\
             {{%- if m.role == 'system' %}}{{{{ {system} }}}}\
             {{%- elif m.role == 'user' %}}{{{{ {c} + ' [/INST]' }}}}\
             {{%- else %}}{{{{ {c} + '</s>' }}}}{{%- set ns.inside = false %}}{{%- endif %}}{{%- endfor %}}"
        )
    };
    // Mistral v1 / v3 / v3-tekken: the system message opens the first `[INST]` turn.
    let mistral = |lead: &str, trail: &str, trim: bool| {
        let a = if trim { "(c | trim)" } else { "c" };
        format!(
            "{{%- set ns = namespace(inside=false) %}}{{%- for m in messages %}}{C}\
             {{%- if not ns.inside %}}{{{{ '{lead}[INST]{trail}' }}}}{{%- set ns.inside = true %}}{{%- endif %}}\
             {{%- if m.role == 'system' %}}{{{{ c + '\\n\\n' }}}}\
             {{%- elif m.role == 'user' %}}{{{{ c + '{lead}[/INST]' }}}}\
             {{%- else %}}{{{{ '{trail}' + {a} + '</s>' }}}}{{%- set ns.inside = false %}}{{%- endif %}}{{%- endfor %}}"
        )
    };
    let mistral7 = |sp: &str| {
        t(&format!(
            "{{%- if m.role == 'system' %}}{{{{ '[SYSTEM_PROMPT]{sp}' + c + '[/SYSTEM_PROMPT]' }}}}\
             {{%- elif m.role == 'user' %}}{{{{ '[INST]{sp}' + c + '[/INST]' }}}}\
             {{%- else %}}{{{{ '{sp}' + c + '</s>' }}}}{{%- endif %}}"
        ))
    };
    // Per-role prefix and suffix (roles without one are left out).
    let by_role = |sys: (&str, &str), user: (&str, &str), asst: (&str, &str), prompt: &str| {
        t(&format!(
            "{{%- if m.role == 'system' %}}{{{{ '{}' + c + '{}' }}}}\
             {{%- elif m.role == 'user' %}}{{{{ '{}' + c + '{}' }}}}\
             {{%- elif m.role == 'assistant' %}}{{{{ '{}' + c + '{}' }}}}{{%- endif %}}",
            sys.0, sys.1, user.0, user.1, asst.0, asst.1
        )) + &gen(prompt)
    };
    vec![
        ("chatml", role_turns("<|im_start|>", "\\n", "<|im_end|>\\n", "<|im_start|>assistant\\n")),
        ("llama2", llama2(false, false, false)),
        ("llama2-sys", llama2(true, false, false)),
        ("llama2-sys-bos", llama2(true, true, false)),
        ("llama2-sys-strip", llama2(true, false, true)),
        ("mistral-v1", mistral(" ", " ", false)),
        ("mistral-v3", mistral("", " ", true)),
        ("mistral-v3-tekken", mistral("", "", false)),
        ("mistral-v7", mistral7(" ")),
        ("mistral-v7-tekken", mistral7("")),
        ("phi3", role_turns("<|", "|>\\n", "<|end|>\\n", "<|assistant|>\\n")),
        ("phi4", role_turns("<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>")),
        ("falcon3", role_turns("<|", "|>\\n", "\\n", "<|assistant|>\\n")),
        ("zephyr", role_turns("<|", "|>\\n", "<|endoftext|>\\n", "<|assistant|>\\n")),
        (
            "monarch",
            t("{{ ('' if loop.first else '<s>') + m.role + '\\n' + c + '</s>\\n' }}") + &gen("<s>assistant\\n"),
        ),
        (
            // No system role: its text opens the next user turn.
            "gemma",
            "{%- set ns = namespace(sys='') %}".to_string()
                + &t("{%- if m.role == 'system' %}{%- set ns.sys = ns.sys + (c | trim) %}\
                      {%- else %}{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' }}\
                      {%- if ns.sys and m.role != 'assistant' %}{{ ns.sys + '\\n\\n' }}{%- set ns.sys = '' %}{%- endif %}\
                      {{ (c | trim) + '<end_of_turn>\\n' }}{%- endif %}")
                + &gen("<start_of_turn>model\\n"),
        ),
        (
            "orion",
            "{%- set ns = namespace(sys='') %}".to_string()
                + &t("{%- if m.role == 'system' %}{%- set ns.sys = ns.sys + c %}\
                      {%- elif m.role == 'user' %}{{ 'Human: ' }}{%- if ns.sys %}{{ ns.sys + '\\n\\n' }}{%- set ns.sys = '' %}{%- endif %}\
                      {{ c + '\\n\\nAssistant: </s>' }}{%- else %}{{ c + '</s>' }}{%- endif %}"),
        ),
        (
            "openchat",
            t("{%- if m.role == 'system' %}{{ c + '<|end_of_turn|>' }}\
               {%- else %}{{ 'GPT4 Correct ' + (m.role | capitalize) + ': ' + c + '<|end_of_turn|>' }}{%- endif %}")
                + &gen("GPT4 Correct Assistant:"),
        ),
        ("vicuna", by_role(("", "\\n\\n"), ("USER: ", "\\n"), ("ASSISTANT: ", "</s>\\n"), "ASSISTANT:")),
        ("vicuna-orca", by_role(("SYSTEM: ", "\\n"), ("USER: ", "\\n"), ("ASSISTANT: ", "</s>\\n"), "ASSISTANT:")),
        (
            "deepseek",
            by_role(("", ""), ("### Instruction:\\n", "\\n"), ("### Response:\\n", "\\n<|EOT|>\\n"), "### Response:\\n"),
        ),
        (
            "deepseek2",
            by_role(("", "\\n\\n"), ("User: ", "\\n\\n"), ("Assistant: ", "<｜end▁of▁sentence｜>"), "Assistant:"),
        ),
        (
            "deepseek3",
            by_role(("", "\\n\\n"), ("<｜User｜>", ""), ("<｜Assistant｜>", "<｜end▁of▁sentence｜>"), "<｜Assistant｜>"),
        ),
        (
            "command-r",
            t("{%- if m.role in ['system', 'user', 'assistant'] %}{{ '<|START_OF_TURN_TOKEN|><|' + \
               {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'}[m.role] + '_TOKEN|>' + (c | trim) + \
               '<|END_OF_TURN_TOKEN|>' }}{%- endif %}")
                + &gen("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        ),
        (
            "llama3",
            t("{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + (c | trim) + '<|eot_id|>' }}")
                + &gen("<|start_header_id|>assistant<|end_header_id|>\\n\\n"),
        ),
        (
            "chatglm3",
            "{{ '[gMASK]sop' }}".to_string() + &t("{{ '<|' + m.role + '|>\\n ' + c }}") + &gen("<|assistant|>"),
        ),
        (
            "chatglm4",
            "{{ '[gMASK]<sop>' }}".to_string() + &t("{{ '<|' + m.role + '|>\\n' + c }}") + &gen("<|assistant|>\\n"),
        ),
        ("glmedge", t("{{ '<|' + m.role + '|>\\n' + c }}") + &gen("<|assistant|>")),
        (
            "minicpm",
            t("{%- if m.role == 'user' %}{{ '<用户>' + (c | trim) + '<AI>' }}{%- else %}{{ c | trim }}{%- endif %}"),
        ),
        (
            "granite",
            role_turns("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\\n", "<|start_of_role|>assistant<|end_of_role|>"),
        ),
        ("megrez", role_turns("<|role_start|>", "<|role_end|>", "<|turn_end|>", "<|role_start|>assistant<|role_end|>")),
    ]
}

/// The template called `name`.
pub fn get(name: &str) -> Option<String> {
    all().into_iter().find(|(n, _)| *n == name).map(|(_, t)| t)
}

/// Every name, for messages.
pub fn names() -> Vec<&'static str> {
    all().into_iter().map(|(n, _)| n).collect()
}

#[cfg(test)]
mod tests {
    use crate::chat::{ChatMessage, ChatTemplate};

    /// llama.cpp's test conversation (tests/test-chat-template.cpp), whose expected renderings
    /// for the named formats are the cases below.
    fn conversation() -> Vec<ChatMessage> {
        [
            ("system", "You are a helpful assistant"),
            ("user", "Hello"),
            ("assistant", "Hi there"),
            ("user", "Who are you"),
            ("assistant", "   I am an assistant   "),
            ("user", "Another question"),
        ]
        .into_iter()
        .map(|(r, c)| ChatMessage::new(r, c))
        .collect()
    }

    #[test]
    fn named_templates_render_as_llama_cpp() {
        // Expected outputs of llama.cpp b11434's tests/test-chat-template.cpp for these formats
        // (zephyr, falcon3, deepseek3, mistral-v7-tekken, llama2-sys from the format in
        // src/llama-chat.cpp, which that test does not cover).
        let cases = [
            ("chatml", "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"),
            ("llama2", "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"),
            ("llama2-sys", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"),
            ("llama2-sys-bos", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"),
            ("llama2-sys-strip", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question [/INST]"),
            ("mistral-v1", " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"),
            ("mistral-v3", "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] Another question[/INST]"),
            ("mistral-v3-tekken", "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"),
            ("mistral-v7", "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"),
            ("mistral-v7-tekken", "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"),
            ("phi3", "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"),
            ("phi4", "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>"),
            ("falcon3", "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there\n<|user|>\nWho are you\n<|assistant|>\n   I am an assistant   \n<|user|>\nAnother question\n<|assistant|>\n"),
            ("zephyr", "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   <|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n"),
            ("monarch", "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n"),
            ("gemma", "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"),
            ("orion", "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"),
            ("openchat", "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistant:"),
            ("vicuna", "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"),
            ("vicuna-orca", "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"),
            ("deepseek", "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n"),
            ("deepseek2", "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>User: Who are you\n\nAssistant:    I am an assistant   <｜end▁of▁sentence｜>User: Another question\n\nAssistant:"),
            ("deepseek3", "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Who are you<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another question<｜Assistant｜>"),
            ("command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
            ("llama3", "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
            ("chatglm3", "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>"),
            ("chatglm4", "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n"),
            ("glmedge", "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>"),
            ("minicpm", "You are a helpful assistant<用户>Hello<AI>Hi there<用户>Who are you<AI>I am an assistant<用户>Another question<AI>"),
            ("granite", "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
            ("megrez", "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|>user<|role_end|>Hello<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_end|><|role_start|>user<|role_end|>Who are you<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   <|turn_end|><|role_start|>user<|role_end|>Another question<|turn_end|><|role_start|>assistant<|role_end|>"),
        ];
        assert_eq!(cases.len(), super::all().len(), "every built-in template has a case");
        let msgs = conversation();
        let kwargs = serde_json::Map::new();
        for (name, want) in cases {
            let src = super::get(name).unwrap_or_else(|| panic!("{name} is not built in"));
            let tpl = ChatTemplate::new(&src, "", "").unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = tpl
                .render(&msgs, None, true, &kwargs)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, want, "{name}");
        }
    }
}
