//! GGUF metadata values as JSON: `{"type": "u32", "value": 7}`; arrays carry their full type
//! (`array[str]`, `array[array[i32]]`). Non-finite floats become the strings "nan", "inf", "-inf".
//! Arrays longer than [`SUMMARY_LEN`] are summarised unless `full`.

use gguf::{Array, Value};
use serde_json::{json, Value as J};

pub const SUMMARY_LEN: usize = 16;

fn float(x: f64) -> J {
    if x.is_finite() {
        // f32 values are widened exactly; JSON readers get the same f32 back by rounding.
        J::from(x)
    } else if x.is_nan() {
        J::from("nan")
    } else if x > 0.0 {
        J::from("inf")
    } else {
        J::from("-inf")
    }
}

pub fn scalar(v: &Value) -> J {
    match v {
        Value::U8(x) => J::from(*x),
        Value::I8(x) => J::from(*x),
        Value::U16(x) => J::from(*x),
        Value::I16(x) => J::from(*x),
        Value::U32(x) => J::from(*x),
        Value::I32(x) => J::from(*x),
        Value::U64(x) => J::from(*x),
        Value::I64(x) => J::from(*x),
        Value::F32(x) => float(f64::from(*x)),
        Value::F64(x) => float(*x),
        Value::Bool(x) => J::from(*x),
        Value::String(s) => J::from(s.as_str()),
        Value::Array(a) => array_values(a, usize::MAX),
    }
}

fn array_values(a: &Array, limit: usize) -> J {
    let n = a.len().min(limit);
    J::Array((0..n).map(|i| scalar(&a.get(i).expect("index in range"))).collect())
}

pub fn value(v: &Value, full: bool) -> J {
    match v {
        Value::Array(a) if !full && a.len() > SUMMARY_LEN => json!({
            "type": a.type_string(),
            "length": a.len(),
            "head": array_values(a, 8),
            "summarized": true,
        }),
        Value::Array(a) => {
            json!({ "type": a.type_string(), "length": a.len(), "value": array_values(a, usize::MAX) })
        }
        v => json!({ "type": v.type_string(), "value": scalar(v) }),
    }
}
