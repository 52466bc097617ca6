//! The text ↔ token-id mapping of a GGUF model, built from its `tokenizer.ggml.*` metadata and
//! reproducing llama.cpp's `llama_vocab` (src/llama-vocab.cpp, b11434) so that hf2q feeds a model
//! exactly the ids `llama-tokenize` would:
//!
//! - special tokens (control, user-defined, unknown) are cut out of the text first, longest first,
//!   as `tokenizer_st_partition` does; control tokens only when `parse_special` is set;
//! - `gpt2` vocabularies: byte-level BPE through the HF `tokenizers` crate (BPE model with the GGUF
//!   merges, llama.cpp's pre-tokenizer regexes as `Split` steps, then `ByteLevel` without its regex);
//! - `llama` vocabularies: SentencePiece-style merging of adjacent pieces by the score of the merged
//!   piece, with `<0xNN>` byte fallback (`llm_tokenizer_spm_session`);
//! - `bert` vocabularies: BERT normalisation and pre-tokenisation (HF `tokenizers`), then greedy
//!   longest-match WordPiece on `▁`-prefixed words (`llm_tokenizer_wpm_session`).

use aho_corasick::AhoCorasick;
use gguf::{Array, Metadata};
use std::collections::{BinaryHeap, HashMap};
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    NormalizedString, Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, PreTokenizerWrapper,
    SplitDelimiterBehavior,
};

#[derive(thiserror::Error, Debug)]
pub enum TokenizerError {
    #[error("GGUF metadata has no `{key}`: {hint}")]
    MissingKey { key: String, hint: &'static str },
    #[error("GGUF metadata `{key}` should be {expected}, found {found}")]
    BadType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("GGUF metadata `{key}` has {found} entries, fewer than the {n_vocab} tokens of `tokenizer.ggml.tokens`")]
    TooShort { key: String, found: usize, n_vocab: usize },
    #[error("`tokenizer.ggml.tokens` has \"{text}\" twice (ids {first} and {second}); each token text must be unique")]
    DuplicateToken { text: String, first: u32, second: u32 },
    #[error("`{key}` is token id {id}, but the vocabulary has only {n_vocab} tokens (ids 0..{n_vocab})")]
    IdOutOfRange { key: String, id: u64, n_vocab: usize },
    #[error("unknown token id {id}: the vocabulary has {n_vocab} tokens (ids 0..{n_vocab})")]
    UnknownTokenId { id: u32, n_vocab: usize },
    #[error("tokenizer model `{0}` (tokenizer.ggml.model) is not supported; supported: gpt2, llama, bert")]
    UnsupportedModel(String),
    #[error("pre-tokenizer `{0}` (tokenizer.ggml.pre) is not supported; hint: re-convert the model, or add its regexes to PRE_TOKENIZERS in crates/engine/src/tokenizer.rs (see llama.cpp src/llama-vocab.cpp)")]
    UnsupportedPre(String),
    #[error("cannot build the {what}: {message}")]
    Build { what: &'static str, message: String },
    #[error("cannot encode text: {0}")]
    Encode(String),
}

/// `tokenizer.ggml.token_type` values (`llama_token_type` in llama.cpp's include/llama.h).
const TYPE_UNDEFINED: i32 = 0;
const TYPE_NORMAL: i32 = 1;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;
const TYPE_BYTE: i32 = 6;

/// Token attributes as llama.cpp derives them from the token types (bit flags).
mod attr {
    pub const UNDEFINED: u8 = 0;
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;
}

/// One llama.cpp pre-tokenizer: the `tokenizer.ggml.pre` names that select it, the regexes applied
/// in turn (each splits the pieces of the previous one, keeping matches and gaps), and the flags
/// llama.cpp sets with it (src/llama-vocab.cpp `llm_tokenizer_bpe` and `llama_vocab::impl::load`).
struct PreTokenizerSpec {
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    ignore_merges: bool,
    add_bos: bool,
}

const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CJK_RUN: &str = r"[一-龥ࠀ-一가-퟿]+";
const BLOOM_REGEX: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

const PRE_TOKENIZERS: &[PreTokenizerSpec] = &[
    PreTokenizerSpec {
        names: &["default", ""],
        regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerSpec {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["chatglm-bpe"],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["glm4", "glm5"],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: true,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-llm"],
        regexes: &[
            r"[\r\n]",
            r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            CJK_RUN,
            r"\p{N}+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-coder"],
        regexes: &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_RUN, r"\p{N}"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"],
        regexes: &[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""##,
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["falcon"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        regexes: &[r"\p{N}", GPT2_REGEX],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ],
        regexes: &[GPT2_REGEX],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        regexes: &[QWEN2_REGEX],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["qwen35"],
        regexes: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["seed-coder"],
        regexes: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["bailingmoe", "bailingmoe2", "llada-moe"],
        regexes: &[
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["poro-chat", "bloom", "gpt3-finnish"],
        regexes: &[BLOOM_REGEX],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["viking"],
        regexes: &[BLOOM_REGEX, r"\p{N}"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["tekken"],
        regexes: &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerSpec {
        names: &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        regexes: &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
        add_bos: false,
    },
];

/// Text pieces that end generation when present in the vocabulary (llama.cpp marks them EOG and
/// control), besides the eos/eot/eom ids.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Candidates for the end-of-turn id when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle pad / repo / file-separator tokens, which llama.cpp also counts as EOG.
const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];

enum Model {
    /// Byte-level BPE (`gpt2`).
    Bpe(Box<tokenizers::Tokenizer>),
    /// SentencePiece-style score merging (`llama`).
    Spm,
    /// BPE merges over SentencePiece-style text (spaces as ▁, byte tokens `<0xXX>`): `gemma4`.
    SpmBpe(Box<tokenizers::Tokenizer>),
    /// WordPiece (`bert`).
    Wpm { lowercase: bool, strip_accents: bool },
}

/// A GGUF model's tokenizer. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    token_to_id: HashMap<String, u32>,
    scores: Vec<f32>,
    attrs: Vec<u8>,
    /// `token_bytes(id, true)` of every token.
    pieces: Vec<Vec<u8>>,
    /// Ids of control, user-defined and unknown tokens, longest text first.
    special: Vec<u32>,
    special_matcher: Option<AhoCorasick>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<u32>,
}

fn string_array<'a>(meta: &'a Metadata, key: &str) -> Result<Option<&'a gguf::StrArray>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => match v.as_array().and_then(Array::as_strings) {
            Some(a) => Ok(Some(a)),
            None => Err(TokenizerError::BadType {
                key: key.into(),
                expected: "an array of strings",
                found: v.type_string(),
            }),
        },
    }
}

fn bool_key(meta: &Metadata, key: &str) -> Result<Option<bool>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| TokenizerError::BadType {
            key: key.into(),
            expected: "a bool",
            found: v.type_string(),
        }),
    }
}

/// Element-wise numeric view of an array key (`i32`/`f32`/any number), checked to cover `n` tokens.
fn number_array(meta: &Metadata, key: &str, n: usize) -> Result<Option<Vec<f64>>, TokenizerError> {
    let Some(v) = meta.get(key) else { return Ok(None) };
    let bad = || TokenizerError::BadType {
        key: key.into(),
        expected: "an array of numbers",
        found: v.type_string(),
    };
    let a = v.as_array().ok_or_else(bad)?;
    if a.len() < n {
        return Err(TokenizerError::TooShort {
            key: key.into(),
            found: a.len(),
            n_vocab: n,
        });
    }
    let out: Vec<f64> = match a {
        Array::F32(x) => x.iter().map(|&f| f.into()).collect(),
        Array::I32(x) => x.iter().map(|&i| i.into()).collect(),
        _ => (0..a.len())
            .map(|i| a.get(i).and_then(|e| e.as_f64()).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
    };
    Ok(Some(out))
}

/// GPT-2's byte ↔ printable-char table: bytes that are printable Latin-1 map to themselves, the
/// others to U+0100 upwards in order.
fn byte_level_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("U+0100..")
        };
    }
    table
}

/// `<0xNN>` → NN.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        const MODEL_KEY: &str = "tokenizer.ggml.model";
        let model_name = match meta.get(MODEL_KEY) {
            None => {
                return Err(TokenizerError::MissingKey {
                    key: MODEL_KEY.into(),
                    hint: "the file carries no tokenizer (hint: convert the model with its tokenizer.json)",
                })
            }
            Some(v) => v.as_str().ok_or_else(|| TokenizerError::BadType {
                key: MODEL_KEY.into(),
                expected: "a string",
                found: v.type_string(),
            })?,
        };
        if !matches!(model_name, "gpt2" | "llama" | "bert" | "gemma4") {
            return Err(TokenizerError::UnsupportedModel(model_name.to_string()));
        }

        const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
        let token_list = string_array(meta, TOKENS_KEY)?.ok_or(TokenizerError::MissingKey {
            key: TOKENS_KEY.into(),
            hint: "a GGUF tokenizer needs its vocabulary",
        })?;
        let n = token_list.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::BadType {
                key: TOKENS_KEY.into(),
                expected: "a non-empty array of strings",
                found: format!("{n} strings"),
            });
        }
        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in token_list.iter().enumerate() {
            // llama.cpp names empty entries so that every id has a distinct text.
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.to_string()
            };
            if let Some(first) = token_to_id.insert(text.clone(), i as u32) {
                return Err(TokenizerError::DuplicateToken {
                    text,
                    first,
                    second: i as u32,
                });
            }
            tokens.push(text);
        }

        let scores: Vec<f32> = number_array(meta, "tokenizer.ggml.scores", n)?
            .map(|v| v.into_iter().map(|f| f as f32).collect())
            .unwrap_or_else(|| vec![0.0; n]);
        let attrs: Vec<u8> = match number_array(meta, "tokenizer.ggml.token_type", n)? {
            None => vec![attr::NORMAL; n],
            Some(types) => types[..n]
                .iter()
                .map(|&t| match t as i32 {
                    TYPE_UNKNOWN => attr::UNKNOWN,
                    TYPE_UNUSED => attr::UNUSED,
                    TYPE_NORMAL => attr::NORMAL,
                    TYPE_CONTROL => attr::CONTROL,
                    TYPE_USER_DEFINED => attr::USER_DEFINED,
                    TYPE_BYTE => attr::BYTE,
                    TYPE_UNDEFINED => attr::UNDEFINED,
                    _ => attr::UNDEFINED,
                })
                .collect(),
        };

        let pre = match meta.get("tokenizer.ggml.pre") {
            None => "default",
            Some(v) => v.as_str().ok_or_else(|| TokenizerError::BadType {
                key: "tokenizer.ggml.pre".into(),
                expected: "a string",
                found: v.type_string(),
            })?,
        };

        // Model-type defaults (llama_vocab::impl::load), then the GGUF flags.
        let (model, mut add_bos, mut add_space_prefix, mut bos, mut eos, mut unk, mut sep) = match model_name {
            "gpt2" => {
                let spec = PRE_TOKENIZERS
                    .iter()
                    .find(|s| s.names.contains(&pre))
                    .ok_or_else(|| TokenizerError::UnsupportedPre(pre.to_string()))?;
                let hf = build_bpe(meta, &tokens, spec)?;
                let bos_default = if n > 11 { Some(11) } else { None };
                (
                    Model::Bpe(Box::new(hf)),
                    spec.add_bos,
                    false,
                    bos_default,
                    bos_default,
                    None,
                    None,
                )
            }
            "llama" => (Model::Spm, true, true, Some(1), Some(2), Some(0), None),
            // llama-vocab.cpp: gemma4 is BPE on ▁-spaced text split only at newlines, and always
            // adds BOS (the GGUF flag is overridden to true).
            "gemma4" => (
                Model::SpmBpe(Box::new(build_spm_bpe(meta, &tokens)?)),
                true,
                false,
                Some(2),
                Some(1),
                Some(3),
                None,
            ),
            _ => {
                let lowercase = bool_key(meta, "tokenizer.ggml.normalizer.lowercase")?.unwrap_or(false);
                let strip_accents = bool_key(meta, "tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);
                (
                    Model::Wpm {
                        lowercase,
                        strip_accents,
                    },
                    true,
                    false,
                    Some(101),
                    None,
                    Some(100),
                    Some(102),
                )
            }
        };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        sep = in_range(sep);
        if pre == "chatglm-bpe" || pre == "glm4" || pre == "glm5" {
            bos = None;
        }
        let id_key = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match meta.get(key) {
                None => Ok(None),
                Some(v) => {
                    let id = v.as_u64().ok_or_else(|| TokenizerError::BadType {
                        key: key.into(),
                        expected: "an unsigned integer token id",
                        found: v.to_string(),
                    })?;
                    if id >= n as u64 {
                        return Err(TokenizerError::IdOutOfRange {
                            key: key.into(),
                            id,
                            n_vocab: n,
                        });
                    }
                    Ok(Some(id as u32))
                }
            }
        };
        bos = id_key("tokenizer.ggml.bos_token_id")?.or(bos);
        eos = id_key("tokenizer.ggml.eos_token_id")?.or(eos);
        unk = id_key("tokenizer.ggml.unknown_token_id")?.or(unk);
        sep = id_key("tokenizer.ggml.seperator_token_id")?.or(sep);
        let mut eot = id_key("tokenizer.ggml.eot_token_id")?;
        let mut eom = id_key("tokenizer.ggml.eom_token_id")?;
        for key in [
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.mask_token_id",
            "tokenizer.ggml.cls_token_id",
        ] {
            id_key(key)?;
        }
        if let Some(b) = bool_key(meta, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        let add_eos = bool_key(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if let Some(b) = bool_key(meta, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = b;
        }

        // End-of-generation set (llama_vocab::impl::load): named tokens become control tokens.
        let mut attrs = attrs;
        let find = |texts: &[&str]| texts.iter().filter_map(|t| token_to_id.get(*t).copied()).min();
        if eot.is_none() {
            eot = find(EOT_TEXTS);
        }
        if eom.is_none() {
            eom = find(&["<|eom_id|>"]);
        }
        let mut eog: Vec<u32> = Vec::new();
        for group in FIM_EOG_TEXTS {
            if let Some(id) = find(group) {
                attrs[id as usize] |= attr::CONTROL;
                eog.push(id);
            }
        }
        for id in [eot, eom].into_iter().flatten() {
            attrs[id as usize] |= attr::CONTROL;
        }
        for text in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*text) {
                attrs[id as usize] |= attr::CONTROL;
                eog.push(id);
            }
        }
        // gpt-oss's harmony format: `<|end|>` ends a message, not the generation.
        let has = |eog: &[u32], t: &str| eog.iter().any(|&id| tokens[id as usize] == t);
        if has(&eog, "<|end|>")
            && ((has(&eog, "<|return|>") && has(&eog, "<|call|>"))
                || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>")))
        {
            let end = token_to_id["<|end|>"];
            eog.retain(|&id| id != end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
        if has(&eog, "</s>") && (has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>")) {
            let s = token_to_id["</s>"];
            eog.retain(|&id| id != s);
            attrs[s as usize] = attr::NORMAL;
        }
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(t) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        let special_matcher = if special.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::new(special.iter().map(|&i| tokens[i as usize].as_str())).map_err(|e| {
                    TokenizerError::Build {
                        what: "special-token matcher",
                        message: e.to_string(),
                    }
                })?,
            )
        };

        let mut tok = Tokenizer {
            model,
            tokens,
            token_to_id,
            scores,
            attrs,
            pieces: Vec::new(),
            special,
            special_matcher,
            bos,
            eos,
            unk,
            sep,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
        };
        let byte_chars = byte_level_chars();
        let mut char_to_byte = HashMap::with_capacity(256);
        for (b, c) in byte_chars.iter().enumerate() {
            char_to_byte.insert(*c, b as u8);
        }
        tok.pieces = (0..n).map(|i| tok.render_piece(i, &char_to_byte)).collect();
        Ok(tok)
    }

    /// llama.cpp's `token_to_piece` with `special = true`.
    fn render_piece(&self, i: usize, char_to_byte: &HashMap<char, u8>) -> Vec<u8> {
        let text = &self.tokens[i];
        let a = self.attrs[i];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.model {
                Model::Bpe(_) => {
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => out.push(b),
                            None => out.extend_from_slice(c.to_string().as_bytes()),
                        }
                    }
                    out
                }
                _ => text.replace('\u{2581}', " ").into_bytes(),
            };
        }
        if a & attr::BYTE != 0 {
            return match parse_byte_token(text) {
                Some(b) => vec![b],
                None => match self.model {
                    Model::Bpe(_) => text.chars().filter_map(|c| char_to_byte.get(&c).copied()).collect(),
                    _ => text.as_bytes().to_vec(),
                },
            };
        }
        Vec::new()
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Token ids of `text`. `add_special` adds BOS / EOS as the model asks (for WordPiece models
    /// CLS and SEP); `parse_special` lets control tokens written in the text (`<|im_start|>`) stand
    /// for themselves; user-defined tokens are always recognised, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::new();
        match &self.model {
            Model::Bpe(hf) | Model::SpmBpe(hf) => {
                // gemma4's BPE works on SentencePiece-style text: spaces as ▁.
                let spm = matches!(self.model, Model::SpmBpe(_));
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                for f in &fragments {
                    match *f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s, e) => {
                            let piece = if spm {
                                std::borrow::Cow::Owned(text[s..e].replace(' ', "\u{2581}"))
                            } else {
                                std::borrow::Cow::Borrowed(&text[s..e])
                            };
                            let enc = hf
                                .encode_fast(piece.as_ref(), false)
                                .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                            out.extend_from_slice(enc.get_ids());
                        }
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
            Model::Spm => {
                let mut prev_special = true;
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                for f in &fragments {
                    match *f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(s, e) => {
                            let mut piece = String::with_capacity(e - s + 3);
                            if self.add_space_prefix && prev_special {
                                piece.push(' ');
                            }
                            piece.push_str(&text[s..e]);
                            let piece = piece.replace(' ', "\u{2581}");
                            self.spm_tokenize(&piece, &mut out);
                            prev_special = false;
                        }
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
            Model::Wpm {
                lowercase,
                strip_accents,
            } => {
                if add_special {
                    out.extend(self.bos);
                }
                for f in &fragments {
                    match *f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s, e) => self.wpm_tokenize(&text[s..e], *lowercase, *strip_accents, &mut out)?,
                    }
                }
                if add_special {
                    out.extend(self.sep);
                }
            }
        }
        Ok(out)
    }

    /// Cut the special tokens out of `text`, longest first (llama.cpp `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = vec![Fragment::Text(0, text.len())];
        let Some(matcher) = &self.special_matcher else {
            return frags;
        };
        if text.is_empty() {
            return Vec::new();
        }
        // Only the special tokens that occur somewhere in the text need the slow pass below.
        let mut present = vec![false; self.special.len()];
        for m in matcher.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        for (k, &id) in self.special.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut s, e) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = text[s..e].find(needle) {
                    if pos > 0 {
                        next.push(Fragment::Text(s, s + pos));
                    }
                    next.push(Fragment::Token(id));
                    s += pos + needle.len();
                }
                if s < e {
                    next.push(Fragment::Text(s, e));
                }
            }
            frags = next;
        }
        frags
    }

    /// Merge adjacent pieces into the vocabulary piece of highest score, leftmost first; pieces that
    /// are no token become `<0xNN>` byte tokens (llama.cpp `llm_tokenizer_spm_session`).
    fn spm_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        #[derive(Clone, Copy)]
        struct Sym {
            start: usize,
            len: usize,
            prev: Option<usize>,
            next: Option<usize>,
        }
        #[derive(PartialEq)]
        struct Bigram {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Bigram {}
        impl Ord for Bigram {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                // Highest score first, then leftmost.
                self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Bigram {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }

        let mut syms: Vec<Sym> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            syms.push(Sym {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
        }
        let count = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.next = (i + 1 < count).then_some(i + 1);
        }
        let mut queue = BinaryHeap::new();
        let try_add = |syms: &[Sym], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else { return };
            let (start, size) = (syms[l].start, syms[l].len + syms[r].len);
            if let Some(&id) = self.token_to_id.get(&text[start..start + size]) {
                queue.push(Bigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    size,
                });
            }
        };
        for i in 1..count {
            try_add(&syms, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            syms[b.left].len += r.len;
            syms[b.right].len = 0;
            syms[b.left].next = r.next;
            if let Some(n) = r.next {
                syms[n].prev = Some(b.left);
            }
            try_add(&syms, &mut queue, syms[b.left].prev, Some(b.left));
            try_add(&syms, &mut queue, Some(b.left), syms[b.left].next);
        }
        let mut i = if count > 0 { Some(0) } else { None };
        while let Some(k) = i {
            let s = syms[k];
            let piece = &text[s.start..s.start + s.len];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        let id = self
                            .token_to_id
                            .get(&format!("<0x{b:02X}>"))
                            .or_else(|| self.token_to_id.get(&(b as char).to_string()))
                            .copied()
                            .or(self.unk);
                        out.extend(id);
                    }
                }
            }
            i = s.next;
        }
    }

    /// BERT normalisation and split, then greedy longest match of `▁word` (llama.cpp
    /// `llm_tokenizer_wpm_session`); a word with no full cover becomes the unknown token.
    fn wpm_tokenize(
        &self,
        text: &str,
        lowercase: bool,
        strip_accents: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let err = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        let mut normalized = NormalizedString::from(text);
        BertNormalizer::new(true, true, Some(strip_accents), lowercase)
            .normalize(&mut normalized)
            .map_err(err)?;
        let mut pre = PreTokenizedString::from(normalized);
        BertPreTokenizer.pre_tokenize(&mut pre).map_err(err)?;
        let max_len = self.tokens.iter().map(String::len).max().unwrap_or(0);
        for (word, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            if word.is_empty() {
                continue;
            }
            let w = format!("\u{2581}{word}");
            let start_len = out.len();
            let mut i = 0;
            while i < w.len() {
                let mut j = (i + max_len + 1).min(w.len());
                let mut found = None;
                while j > i {
                    if w.is_char_boundary(j) {
                        if let Some(&id) = self.token_to_id.get(&w[i..j]) {
                            found = Some((id, j));
                            break;
                        }
                    }
                    j -= 1;
                }
                match found {
                    Some((id, end)) => {
                        out.push(id);
                        i = end;
                    }
                    None => {
                        out.truncate(start_len);
                        break;
                    }
                }
            }
            if out.len() == start_len {
                out.extend(self.unk);
            }
        }
        Ok(())
    }

    /// The bytes of one token as llama.cpp's `token_to_piece` renders it: byte-level BPE text
    /// decoded to bytes, SentencePiece `▁` as a space and `<0xNN>` as that byte. Control and
    /// unknown tokens render as their text only when `special` is set; unknown ids as nothing.
    pub fn token_bytes(&self, id: u32, special: bool) -> Vec<u8> {
        let i = id as usize;
        if i >= self.tokens.len() {
            return Vec::new();
        }
        if !special && self.attrs[i] & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return Vec::new();
        }
        self.pieces[i].clone()
    }

    /// Like [`token_bytes`](Self::token_bytes), but an unknown id is an error.
    pub fn try_token_bytes(&self, id: u32, special: bool) -> Result<Vec<u8>, TokenizerError> {
        self.check_id(id)?;
        Ok(self.token_bytes(id, special))
    }

    /// An error naming `id` and the vocabulary size when `id` is no token of this vocabulary.
    pub fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.tokens.len() {
            Ok(())
        } else {
            Err(TokenizerError::UnknownTokenId {
                id,
                n_vocab: self.tokens.len(),
            })
        }
    }

    /// The text of `ids` (lossy UTF-8 of their concatenated [`token_bytes`](Self::token_bytes)).
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend(self.token_bytes(id, special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The vocabulary entry as stored in the GGUF.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether generating `id` ends the generation (eos, eot, eom and the end-of-turn tokens
    /// llama.cpp recognises by name).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        match self.model {
            Model::Wpm { .. } => self.bos.is_some(),
            _ => self.add_bos && self.bos.is_some(),
        }
    }

    /// Whether the token is a control token (rendered only with `special`).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a & attr::CONTROL != 0)
    }
}

enum Fragment {
    /// A byte range of the input text.
    Text(usize, usize),
    Token(u32),
}

/// The BPE model of a vocabulary and its GGUF merges (`byte_fallback`: unknown characters become
/// `<0xXX>` byte tokens).
fn bpe_model(
    meta: &Metadata,
    tokens: &[String],
    hint: &'static str,
    ignore_merges: bool,
    byte_fallback: bool,
) -> Result<BPE, TokenizerError> {
    const MERGES_KEY: &str = "tokenizer.ggml.merges";
    let merge_list = string_array(meta, MERGES_KEY)?.ok_or(TokenizerError::MissingKey {
        key: MERGES_KEY.into(),
        hint,
    })?;
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut seen = std::collections::HashSet::new();
    let mut merges = Vec::with_capacity(merge_list.len());
    for m in merge_list.iter() {
        // llama.cpp splits at the first space after the first byte; a merge whose parts or result
        // are not in the vocabulary can never yield a token, and HF's BPE refuses it.
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        if !vocab.contains_key(a) || !vocab.contains_key(b) || !vocab.contains_key(&format!("{a}{b}")) {
            continue;
        }
        if seen.insert((a.to_string(), b.to_string())) {
            merges.push((a.to_string(), b.to_string()));
        }
    }
    BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .byte_fallback(byte_fallback)
        .build()
        .map_err(|e| TokenizerError::Build {
            what: "BPE model",
            message: e.to_string(),
        })
}

/// A pre-tokenizer step splitting out the matches of `re` (kept as their own pieces).
fn split_step(re: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let split = Split::new(
        SplitPattern::Regex(re.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TokenizerError::Build {
        what: "pre-tokenizer regex",
        message: format!("{re}: {e}"),
    })?;
    Ok(split.into())
}

/// The HF `tokenizers` byte-level BPE for a `gpt2` vocabulary and one llama.cpp pre-tokenizer.
fn build_bpe(
    meta: &Metadata,
    tokens: &[String],
    spec: &PreTokenizerSpec,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let bpe = bpe_model(
        meta,
        tokens,
        "a gpt2 (byte-level BPE) tokenizer needs its merges",
        spec.ignore_merges,
        false,
    )?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for re in spec.regexes {
        steps.push(split_step(re)?);
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(hf)
}

/// The `gemma4` tokenizer's BPE: the GGUF merges, no byte-level mapping (text keeps ▁ for spaces,
/// unknown characters fall back to `<0xXX>` byte tokens), pre-split only into runs of newlines
/// and runs of other characters (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GEMMA4).
fn build_spm_bpe(meta: &Metadata, tokens: &[String]) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let bpe = bpe_model(meta, tokens, "a gemma4 tokenizer needs its merges", false, true)?;
    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(Sequence::new(vec![split_step("[^\\n]+|[\\n]+")?])));
    Ok(hf)
}

/// Incremental detokenizer: feed token ids one by one and get back only complete UTF-8 text, so a
/// character split across byte-level tokens is never emitted in halves.
pub struct StreamDecoder {
    special: bool,
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new(special: bool) -> Self {
        StreamDecoder {
            special,
            pending: Vec::new(),
        }
    }

    /// The text completed by `id`; bytes of an unfinished character wait for the next call.
    /// Bytes that can never form a character are emitted as U+FFFD.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id, self.special));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"));
                    match e.error_len() {
                        // An incomplete character at the end: keep it for later.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left, lossily (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
