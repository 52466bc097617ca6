//! One reply of a chat request as a stream of typed pieces (thinking, text, complete tool calls,
//! the end), for the APIs that are not chat completions (Responses, Messages). They share the
//! chat pipeline up to here (`prepare_chat`: validation, template, tokens, grammar) and the engine
//! path; each renders these pieces in its own wire format.

use super::respond::Telemetry;
use super::{reasoning, record, tools, worker, ApiError, Finish, Prepared, Shared, Timing};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use worker::{Event, Job};

/// A piece of the reply, in order.
#[derive(Debug)]
pub enum Delta {
    Thought(String),
    Text(String),
    Call(tools::Call),
    /// The prompt's prefill so far (a request with llama-server's `return_progress`).
    Progress(worker::Progress),
    /// llama-server's `timings` so far, before the pieces of each token (`timings_per_token`).
    Timings(serde_json::Value),
    Done(Summary),
    Error(ApiError),
}

/// How the reply ended.
#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: Finish,
    /// The stop string that ended it, if one did.
    pub stop: Option<String>,
    /// Tool calls it made.
    pub calls: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// llama-server's `timings` of the reply.
    pub timings: serde_json::Value,
}

/// Queue the request's one reply and turn the engine's events into [`Delta`]s. Dropping the
/// receiver (a client that went away) drops the engine's channel: the job leaves its slot.
pub fn start(st: &Shared, p: Prepared) -> Result<UnboundedReceiver<Delta>, ApiError> {
    let w = p.worker.clone();
    let constraint = match (&p.grammar, &p.format) {
        (Some(lark), _) => Some(w.grammar()?.lark(lark)?),
        (None, Some(schema)) => Some(w.grammar()?.json(schema.as_ref())?),
        (None, None) => None,
    };
    let (etx, mut erx) = unbounded_channel::<(usize, Event)>();
    w.submit(Job {
        choice: 0,
        constraint,
        prompt: p.prompt.clone(),
        params: p.params.clone(),
        events: etx,
    })?;
    let (tx, rx) = unbounded_channel();
    let st = st.clone();
    let mut splitter = p.reasoning.map(|(m, inside)| reasoning::Splitter::new(inside, m));
    let mut calls = p.tools.then(|| tools::ToolStream::new(p.tool_format, p.tools_parallel));
    let (per_token, progress) = (p.timings_per_token, p.return_progress);
    tokio::spawn(async move {
        let mut timing = Timing::new();
        let mut telemetry = Telemetry::default();
        let mut made = 0usize;
        // Text through the tool-call parser when the request has tools.
        let text =
            |t: String, out: &mut Vec<Delta>, calls: &mut Option<tools::ToolStream>, made: &mut usize, finish: bool| {
                let pieces = match calls {
                    Some(ts) => {
                        let mut v = ts.push(&t);
                        if finish {
                            v.extend(ts.finish());
                        }
                        v
                    }
                    None if t.is_empty() => Vec::new(),
                    None => vec![tools::Piece::Text(t)],
                };
                for piece in pieces {
                    match piece {
                        tools::Piece::Text(s) if !s.is_empty() => out.push(Delta::Text(s)),
                        tools::Piece::Text(_) => {}
                        tools::Piece::Call(c) => {
                            *made += 1;
                            out.push(Delta::Call(c));
                        }
                    }
                }
            };
        loop {
            let ev = tokio::select! {
                ev = erx.recv() => ev,
                _ = tx.closed() => return,
            };
            let Some((_, ev)) = ev else {
                let _ = tx.send(Delta::Error(ApiError::internal("the engine stopped before finishing")));
                return;
            };
            timing.observe(&st, &ev);
            telemetry.observe(&ev);
            let mut out = Vec::new();
            let mut last = false;
            match ev {
                Event::Progress(pr) => {
                    if progress {
                        out.push(Delta::Progress(pr));
                    }
                }
                Event::Token(t, _) => {
                    if per_token {
                        out.push(Delta::Timings(telemetry.timings()));
                    }
                    let (thought, t) = match &mut splitter {
                        Some(sp) => sp.push(&t),
                        None => (String::new(), t),
                    };
                    if !thought.is_empty() {
                        out.push(Delta::Thought(thought));
                    }
                    text(t, &mut out, &mut calls, &mut made, false);
                }
                Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    stop,
                    ..
                } => {
                    let rest = match &mut splitter {
                        Some(sp) => {
                            let (thought, t) = sp.finish();
                            if !thought.is_empty() {
                                out.push(Delta::Thought(thought));
                            }
                            t
                        }
                        None => String::new(),
                    };
                    text(rest, &mut out, &mut calls, &mut made, true);
                    record(&st, prompt_tokens, completion_tokens, cached_tokens);
                    out.push(Delta::Done(Summary {
                        finish,
                        stop,
                        calls: made,
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens,
                        timings: telemetry.timings(),
                    }));
                    last = true;
                }
                Event::Error(e) => {
                    out.push(Delta::Error(e));
                    last = true;
                }
            }
            for d in out {
                if tx.send(d).is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    Ok(rx)
}

/// The whole reply, collected.
#[derive(Debug, Default)]
pub struct Reply {
    pub thought: String,
    pub text: String,
    pub calls: Vec<tools::Call>,
    pub summary: Option<Summary>,
}

pub async fn collect(mut rx: UnboundedReceiver<Delta>) -> Result<Reply, ApiError> {
    let mut r = Reply::default();
    while let Some(d) = rx.recv().await {
        match d {
            Delta::Thought(t) => r.thought.push_str(&t),
            Delta::Text(t) => r.text.push_str(&t),
            Delta::Call(c) => r.calls.push(c),
            Delta::Progress(_) | Delta::Timings(_) => {}
            Delta::Done(s) => {
                r.summary = Some(s);
                return Ok(r);
            }
            Delta::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the engine stopped before finishing"))
}
