//! Thinking models write their reasoning between markers: `<think>` … `</think>` (Qwen3,
//! DeepSeek-R1 and their templates), `<|channel>thought` … `<channel|>` (Gemma 4). That text goes
//! to `reasoning_content`, never into `content`. A prompt that already opens the block (templates
//! that start the reply inside it) starts the splitter inside.

/// The markers around a model family's reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Markers {
    pub open: &'static str,
    pub close: &'static str,
}

pub const THINK: Markers = Markers {
    open: "<think>",
    close: "</think>",
};

/// Gemma 4's thought channel (its template closes an empty one when thinking is off).
pub const GEMMA4: Markers = Markers {
    open: "<|channel>thought",
    close: "<channel|>",
};

/// The reasoning markers a chat template uses, if any.
pub fn template_markers(source: &str) -> Option<Markers> {
    if source.contains("<|channel>") {
        Some(GEMMA4)
    } else if source.contains(THINK.open) {
        Some(THINK)
    } else {
        None
    }
}

/// Whether the rendered prompt leaves a reasoning block open (the reply starts inside it).
pub fn prompt_opens(prompt: &str, m: Markers) -> bool {
    match (prompt.rfind(m.open), prompt.rfind(m.close)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Streaming splitter: feed text pieces, get (reasoning, content) pieces; text that may be the
/// start of a marker is held back until it is decided.
pub struct Splitter {
    markers: Markers,
    inside: bool,
    pending: String,
    /// Just after `</think>`: the blank lines before the answer are dropped.
    after_close: bool,
}

impl Splitter {
    pub fn new(inside: bool, markers: Markers) -> Splitter {
        Splitter {
            markers,
            inside,
            pending: String::new(),
            after_close: false,
        }
    }

    pub fn push(&mut self, text: &str) -> (String, String) {
        self.pending.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            let marker = if self.inside {
                self.markers.close
            } else {
                self.markers.open
            };
            if let Some(at) = self.pending.find(marker) {
                let before: String = self.pending[..at].to_string();
                if self.inside {
                    reasoning.push_str(&before);
                } else {
                    self.content(&before, &mut content);
                }
                self.pending.drain(..at + marker.len());
                self.inside = !self.inside;
                self.after_close = !self.inside;
                continue;
            }
            // Keep a tail that could still become the marker.
            let keep = (1..marker.len().min(self.pending.len() + 1))
                .rev()
                .find(|&k| {
                    self.pending.is_char_boundary(self.pending.len() - k)
                        && marker.starts_with(&self.pending[self.pending.len() - k..])
                })
                .unwrap_or(0);
            let emit_to = self.pending.len() - keep;
            let out: String = self.pending.drain(..emit_to).collect();
            if self.inside {
                reasoning.push_str(&out);
            } else {
                self.content(&out, &mut content);
            }
            return (reasoning, content);
        }
    }

    fn content(&mut self, text: &str, out: &mut String) {
        let text = if self.after_close {
            text.trim_start_matches('\n')
        } else {
            text
        };
        if !text.is_empty() {
            self.after_close = false;
        }
        out.push_str(text);
    }

    /// Whatever is still held back, at the end of the reply.
    pub fn finish(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.pending);
        if self.inside {
            (rest, String::new())
        } else {
            let mut c = String::new();
            self.content(&rest, &mut c);
            (String::new(), c)
        }
    }
}

/// Split a whole reply.
pub fn split(text: &str, inside: bool, markers: Markers) -> (String, String) {
    let mut s = Splitter::new(inside, markers);
    let (mut r, mut c) = s.push(text);
    let (r2, c2) = s.finish();
    r.push_str(&r2);
    c.push_str(&c2);
    (r.trim().to_string(), c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_whole_and_streamed_replies_alike() {
        let reply = "<think>\nThe user greets me.\n</think>\n\nHello!";
        assert_eq!(
            split(reply, false, THINK),
            ("The user greets me.".to_string(), "Hello!".to_string())
        );
        // Streamed one character at a time: the same text, markers never leak.
        let mut s = Splitter::new(false, THINK);
        let (mut r, mut c) = (String::new(), String::new());
        for ch in reply.chars() {
            let (a, b) = s.push(&ch.to_string());
            r.push_str(&a);
            c.push_str(&b);
        }
        let (a, b) = s.finish();
        r.push_str(&a);
        c.push_str(&b);
        assert_eq!(r.trim(), "The user greets me.");
        assert_eq!(c, "Hello!");
        // A prompt that opened the block: the reply starts inside it.
        assert_eq!(
            split("plan</think>\n\nDone.", true, THINK),
            ("plan".to_string(), "Done.".to_string())
        );
        assert!(prompt_opens("<|im_start|>assistant\n<think>\n", THINK));
        assert!(!prompt_opens("<think>\n\n</think>\n\n", THINK));
        // Without markers everything is content.
        assert_eq!(
            split("just text <thi", false, THINK),
            (String::new(), "just text <thi".to_string())
        );
        // Gemma 4: the thought channel; a prompt that closed an empty one (thinking off) is not open.
        assert_eq!(
            split("<|channel>thought\nCount the letters.<channel|>Three.", false, GEMMA4),
            ("Count the letters.".to_string(), "Three.".to_string())
        );
        assert!(!prompt_opens("<|turn>model\n<|channel>thought\n<channel|>", GEMMA4));
        assert_eq!(template_markers("{{ '<|channel>thought\n' }}"), Some(GEMMA4));
        assert_eq!(template_markers("<think>"), Some(THINK));
    }
}
