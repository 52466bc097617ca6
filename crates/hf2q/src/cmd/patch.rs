//! `hf2q gguf-patch FILE`: set, change or delete metadata keys; tensor data is copied untouched
//! and the file is written atomically (temporary file, fsync, rename).

use crate::error::{CliError, CliResult};
use crate::json;
use gguf::{GgufFile, Metadata, Value, ValueType};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PatchArgs {
    /// The GGUF file to patch.
    pub file: PathBuf,
    /// Set a key with an explicit type: KEY=TYPE:VALUE, TYPE one of u8 i8 u16 i16 u32 i32 u64 i64
    /// f32 f64 bool str (e.g. `general.name=str:My Model`, `foo.bar=u32:7`). Repeatable.
    #[arg(long = "set", value_name = "KEY=TYPE:VALUE")]
    pub set: Vec<String>,
    /// Delete a key. Repeatable.
    #[arg(long = "delete", value_name = "KEY")]
    pub delete: Vec<String>,
    /// Replace `tokenizer.chat_template` with the contents of this file.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Write the patched file here.
    #[arg(short, long, conflicts_with = "in_place")]
    pub output: Option<PathBuf>,
    /// Replace FILE itself (atomically).
    #[arg(long)]
    pub in_place: bool,
    /// Print what would change and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// One requested change.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    Set(String, Value),
    Delete(String),
}

/// Parse `KEY=TYPE:VALUE`.
pub fn parse_set(arg: &str) -> Result<Edit, String> {
    let (key, rest) = arg
        .split_once('=')
        .ok_or_else(|| format!("--set `{arg}`: expected KEY=TYPE:VALUE"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("--set `{arg}`: empty key"));
    }
    let (ty, text) = rest
        .split_once(':')
        .ok_or_else(|| format!("--set `{arg}`: expected TYPE:VALUE after `=`, e.g. u32:7 or str:text"))?;
    let vt = ValueType::from_name(ty.trim())
        .filter(|t| *t != ValueType::Array)
        .ok_or_else(|| {
            format!("--set `{arg}`: unknown type `{ty}` (use u8 i8 u16 i16 u32 i32 u64 i64 f32 f64 bool str)")
        })?;
    let value = Value::parse_typed(vt, text).map_err(|e| format!("--set `{arg}`: {e}"))?;
    Ok(Edit::Set(key.to_string(), value))
}

/// Apply edits in order; returns the diff lines.
pub fn apply(metadata: &mut Metadata, edits: &[Edit]) -> Result<Vec<String>, String> {
    let show = |v: &Value| {
        let j = json::value(v, false);
        format!(
            "{} {}",
            v.type_string(),
            j.get("value").or(j.get("head")).cloned().unwrap_or_default()
        )
    };
    let mut diff = Vec::new();
    for e in edits {
        match e {
            Edit::Set(k, v) => match metadata.insert(k.clone(), v.clone()) {
                Some(old) if &old == v => diff.push(format!("= {k}: {} (unchanged)", show(v))),
                Some(old) => diff.push(format!("~ {k}: {} -> {}", show(&old), show(v))),
                None => diff.push(format!("+ {k}: {}", show(v))),
            },
            Edit::Delete(k) => match metadata.remove(k) {
                Some(old) => diff.push(format!("- {k}: {}", show(&old))),
                None => return Err(format!("--delete `{k}`: no such key in the file")),
            },
        }
    }
    Ok(diff)
}

pub fn run(args: PatchArgs) -> CliResult {
    let mut edits = Vec::new();
    for s in &args.set {
        edits.push(parse_set(s).map_err(CliError::input)?);
    }
    for d in &args.delete {
        edits.push(Edit::Delete(d.clone()));
    }
    if let Some(p) = &args.chat_template {
        let text =
            std::fs::read_to_string(p).map_err(|e| CliError::input(format!("--chat-template {}: {e}", p.display())))?;
        edits.push(Edit::Set(gguf::keys::CHAT_TEMPLATE.into(), Value::String(text)));
    }
    if edits.is_empty() {
        return Err(CliError::input(
            "nothing to do: give --set, --delete or --chat-template",
        ));
    }
    let dest = match (&args.output, args.in_place, args.dry_run) {
        (Some(o), _, _) => Some(o.clone()),
        (None, true, _) => Some(args.file.clone()),
        (None, false, true) => None,
        (None, false, false) => {
            return Err(CliError::input(
                "say where to write: -o OUT or --in-place (or --dry-run)",
            ))
        }
    };
    if !args.file.exists() {
        return Err(CliError::input(format!("{}: no such file", args.file.display())));
    }
    let src = GgufFile::open(&args.file)?;
    let mut metadata = src.metadata().clone();
    let diff = apply(&mut metadata, &edits).map_err(CliError::input)?;
    gguf::writer::alignment_of(&metadata).map_err(CliError::input)?;
    for line in &diff {
        println!("{line}");
    }
    if args.dry_run {
        return Ok(());
    }
    let dest = dest.expect("checked above");
    gguf::rewrite::rewrite_with_metadata(&src, &metadata, &dest).map_err(|e| match e {
        gguf::GgufError::Io { .. } => CliError::runtime(e.to_string()),
        e => CliError::input(e.to_string()),
    })?;
    tracing::info!(dest = %dest.display(), "patched");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_parsing() {
        assert_eq!(
            parse_set("general.name=str:My Model"),
            Ok(Edit::Set("general.name".into(), Value::String("My Model".into())))
        );
        assert_eq!(parse_set("a.b=u32:7"), Ok(Edit::Set("a.b".into(), Value::U32(7))));
        assert_eq!(
            parse_set("a=str:x:y"),
            Ok(Edit::Set("a".into(), Value::String("x:y".into())))
        );
        assert_eq!(parse_set("a=bool:true"), Ok(Edit::Set("a".into(), Value::Bool(true))));
        assert!(parse_set("a=u33:7").unwrap_err().contains("unknown type `u33`"));
        assert!(parse_set("a=u8:300").unwrap_err().contains("not a valid u8"));
        assert!(parse_set("a=7").unwrap_err().contains("TYPE:VALUE"));
        assert!(parse_set("noequals").unwrap_err().contains("KEY=TYPE:VALUE"));
        assert!(parse_set("=u8:1").unwrap_err().contains("empty key"));
        assert!(parse_set("a=array:1").is_err());
    }

    #[test]
    fn apply_keeps_order_and_reports() {
        let mut m: Metadata = [("a".to_string(), Value::U32(1)), ("b".to_string(), Value::U32(2))]
            .into_iter()
            .collect();
        let diff = apply(
            &mut m,
            &[
                Edit::Set("a".into(), Value::U32(5)),
                Edit::Set("c".into(), Value::Bool(true)),
                Edit::Delete("b".into()),
            ],
        )
        .unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(diff, ["~ a: u32 1 -> u32 5", "+ c: bool true", "- b: u32 2"]);
        assert!(apply(&mut m, &[Edit::Delete("zz".into())]).is_err());
    }
}
