//! Constrained decoding through `llguidance` (the engine llama.cpp and vLLM use): a JSON schema (or
//! "any JSON object") becomes a token mask per step, so the output always parses and validates.
//! The token trie is built from the GGUF vocabulary (each token's bytes; control tokens marked as
//! special so they are never produced inside the JSON).

use crate::tokenizer::Tokenizer;
use crate::{EngineError, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tok
            .encode(&String::from_utf8_lossy(s), false, false)
            .unwrap_or_default()
    }
}

/// Builds constraints for one model's vocabulary (made once per model; cheap to use per request).
pub struct GrammarFactory {
    factory: ParserFactory,
}

impl GrammarFactory {
    pub fn new(tok: Arc<Tokenizer>) -> Result<GrammarFactory> {
        let n = tok.n_vocab();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            if tok.is_control(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
                words.push(w);
            } else {
                words.push(tok.token_bytes(id, false));
            }
        }
        let eos = tok.eos().or_else(|| tok.eog_ids().first().copied()).unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tok.bos();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| EngineError::Model(format!("structured output: {e}")))?;
        Ok(GrammarFactory { factory })
    }

    /// A constraint for JSON matching `schema` (any JSON object when `None`).
    pub fn json(&self, schema: Option<&serde_json::Value>) -> Result<Constraint> {
        let schema = schema.cloned().unwrap_or_else(|| serde_json::json!({"type": "object"}));
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| EngineError::Input(format!("invalid JSON schema: {e}")))?;
        Ok(Constraint {
            m: Matcher::new(Ok(parser)),
        })
    }
}

impl GrammarFactory {
    /// A constraint from a Lark grammar (llguidance's dialect, `%json { schema }` included).
    pub fn lark(&self, grammar: &str) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(grammar.to_string()))
            .map_err(|e| EngineError::Input(format!("invalid grammar: {e}")))?;
        Ok(Constraint {
            m: Matcher::new(Ok(parser)),
        })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    m: Matcher,
}

impl Constraint {
    /// Set the logits of tokens the grammar does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let vob = self
            .m
            .compute_mask_or_eos()
            .map_err(|e| EngineError::Backend(format!("grammar: {e}")))?;
        for (i, l) in logits.iter_mut().enumerate() {
            if !vob.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advance over a sampled token.
    pub fn accept(&mut self, tok: u32) -> Result<()> {
        self.m
            .consume_token(tok)
            .map_err(|e| EngineError::Backend(format!("grammar: {e}")))
    }

    /// The grammar is complete and nothing more may follow.
    pub fn is_stopped(&self) -> bool {
        self.m.is_stopped()
    }
}
