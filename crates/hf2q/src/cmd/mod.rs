pub mod bench;
pub mod convert;
pub mod doctor;
pub mod embed;
pub mod generate;
pub mod info;
pub mod patch;
pub mod perplexity;
pub mod quantize;
pub mod runtime;
pub mod serve;

/// Human-readable byte count (binary units, as llama.cpp prints sizes).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Parameter counts as llama.cpp prints them (`134.52 M`).
pub fn human_count(n: u64) -> String {
    let v = n as f64;
    if v >= 1e9 {
        format!("{:.2} B", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} K", v / 1e3)
    } else {
        n.to_string()
    }
}
