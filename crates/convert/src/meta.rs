//! `general.*` metadata the converter derives from the model directory and the tensor list
//! (gguf-py `metadata.py` / `utility.py`: `size_label`, `model_weight_count_rounded_notation`).

/// Python's `str.title()`: upper-case the first letter of each run of letters, lower-case the rest.
pub fn python_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        if c.is_alphabetic() {
            if prev_cased {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            prev_cased = true;
        } else {
            out.push(c);
            prev_cased = false;
        }
    }
    out
}

/// utility.py: model_weight_count_rounded_notation
pub fn rounded_count(n: u64, min_digits: usize) -> String {
    let v = n as f64;
    let (scaled, suffix) = if v > 1e12 {
        (v * 1e-12, "T")
    } else if v > 1e9 {
        (v * 1e-9, "B")
    } else if v > 1e6 {
        (v * 1e-6, "M")
    } else {
        (v * 1e-3, "K")
    };
    // Python's round() is half-to-even; str() of the int, leading zeros stripped.
    let r = scaled.round_ties_even() as i64;
    let digits = r.to_string().trim_start_matches('0').len();
    let fix = min_digits.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

/// Parameter counts as `GGUFWriter.get_total_parameter_count` computes them from (name, shape).
pub fn parameter_counts<'a>(tensors: impl Iterator<Item = (&'a str, &'a [usize])>) -> (u64, u64, u64, u64) {
    let (mut total, mut shared, mut expert, mut expert_sum, mut n_expert_tensors) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for (name, shape) in tensors {
        let size: u64 = shape.iter().map(|&d| d as u64).product();
        if name.contains("_exps.") && shape.len() >= 3 {
            let count = shape[shape.len() - if name.contains(".bias") { 2 } else { 3 }] as u64;
            expert += size / count.max(1);
            expert_sum += count;
            n_expert_tensors += 1;
        } else {
            shared += size;
        }
        total += size;
    }
    let expert_count = expert_sum.checked_div(n_expert_tensors).unwrap_or(0);
    (total, shared, expert, expert_count)
}

/// utility.py: size_label
pub fn size_label(total: u64, shared: u64, expert: u64, expert_count: u64) -> String {
    if expert_count > 0 {
        format!("{expert_count}x{}", rounded_count(shared + expert, 2))
    } else {
        rounded_count(total, 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_and_labels() {
        assert_eq!(python_title("qwen3_5_moe_text"), "Qwen3_5_Moe_Text");
        assert_eq!(python_title("deepseek_v4"), "Deepseek_V4");
        assert_eq!(rounded_count(623_360, 2), "623K");
        assert_eq!(rounded_count(2_432_000, 2), "2.4M");
        assert_eq!(rounded_count(134_515_008, 2), "135M");
        assert_eq!(size_label(0, 1_000_000, 500_000, 4), "4x1.5M");
    }
}
