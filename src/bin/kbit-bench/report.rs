//! Output: aligned Markdown tables, a small JSON writer, file names.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A Markdown table whose columns are padded to a common width.
pub struct Table {
    header: Vec<String>,
    /// Right-aligned (numeric) columns.
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named `header`; the first `left` are left-aligned.
    pub fn new(header: &[&str], left: usize) -> Self {
        Self {
            header: header.iter().map(|s| s.to_string()).collect(),
            right: (0..header.len()).map(|i| i >= left).collect(),
            rows: Vec::new(),
        }
    }

    /// Left-aligns one more (text) column.
    pub fn left(mut self, col: usize) -> Self {
        self.right[col] = false;
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows.iter().map(|r| r[i].chars().count()).chain([self.header[i].chars().count(), 3]).max().unwrap_or(3)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, c) in cells.iter().enumerate() {
                let pad = widths[i] - c.chars().count();
                if self.right[i] {
                    let _ = write!(s, " {}{c} |", " ".repeat(pad));
                } else {
                    let _ = write!(s, " {c}{} |", " ".repeat(pad));
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.header);
        out.push('|');
        for (i, w) in widths.iter().enumerate() {
            if self.right[i] {
                let _ = write!(out, " {}: |", "-".repeat(w - 1));
            } else {
                let _ = write!(out, " {} |", "-".repeat(*w));
            }
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// A time in µs: 3 significant digits or more.
pub fn us(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

pub fn opt_us(v: Option<f64>) -> String {
    v.map_or("-".into(), us)
}

/// A ratio such as `2.45×`.
pub fn ratio(v: f64) -> String {
    format!("{v:.2}×")
}

/// A JSON value (written by hand to keep the library free of serde).
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Int(i64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// Compact JSON; arrays of objects get one element per line.
    pub fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(v) if v.is_finite() => {
                // Enough digits for µs to ns and GB/s to 0.01.
                let s = format!("{v:.4}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                out.push_str(if s.is_empty() || s == "-" { "0" } else { s });
            }
            Json::Num(_) => out.push_str("null"),
            Json::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Json::Str(s) => escape(s, out),
            Json::Arr(items) => {
                let lines = items.iter().any(|i| matches!(i, Json::Obj(_)));
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    if lines {
                        out.push_str("\n  ");
                    }
                    item.write(out);
                }
                if lines {
                    out.push('\n');
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    escape(k, out);
                    out.push_str(": ");
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

fn escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `NVIDIA H100 80GB HBM3` → `nvidia-h100-80gb-hbm3`.
pub fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
    }
    let s = s.trim_end_matches('-').to_string();
    if s.is_empty() { "gpu".into() } else { s }
}

/// `DIR/BASE.json` and `DIR/BASE.md`, or with `-2`, `-3`, … appended to
/// `BASE` where an earlier run of the same GPU and day left either file:
/// a run never overwrites another's results.
pub fn free_names(dir: &Path, base: &str) -> (PathBuf, PathBuf) {
    let pair = |b: &str| (dir.join(format!("{b}.json")), dir.join(format!("{b}.md")));
    let (mut j, mut m) = pair(base);
    let mut i = 2;
    while j.exists() || m.exists() {
        (j, m) = pair(&format!("{base}-{i}"));
        i += 1;
    }
    (j, m)
}

/// (year, month, day) of a count of days since 1970-01-01 (proleptic
/// Gregorian calendar).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Today (UTC) as `yyyy-mm-dd`, and the time as `yyyy-mm-ddThh:mm:ssZ`.
pub fn now_utc() -> (String, String) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    let date = format!("{y:04}-{m:02}-{d:02}");
    let stamp = format!("{date}T{:02}:{:02}:{:02}Z", t / 3600, t / 60 % 60, t % 60);
    (date, stamp)
}

/// The commit measured: `KBIT_COMMIT`, else `git rev-parse HEAD` (with
/// `-dirty` when the tree has changes), else `unknown`.
pub fn commit() -> String {
    if let Ok(c) = std::env::var("KBIT_COMMIT")
        && !c.trim().is_empty()
    {
        return c.trim().to_string();
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(head) if !head.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        _ => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_names_never_reuse_a_run_s_files() {
        let dir = std::env::temp_dir().join(format!("kbit-bench-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (j, m) = free_names(&dir, "gpu-2026-01-02");
        assert_eq!(
            (j.file_name().unwrap(), m.file_name().unwrap()),
            ("gpu-2026-01-02.json".as_ref(), "gpu-2026-01-02.md".as_ref())
        );
        std::fs::write(&m, "").unwrap(); // either file taken is enough
        let (j2, m2) = free_names(&dir, "gpu-2026-01-02");
        assert_eq!(
            (j2.file_name().unwrap(), m2.file_name().unwrap()),
            ("gpu-2026-01-02-2.json".as_ref(), "gpu-2026-01-02-2.md".as_ref())
        );
        std::fs::write(&j2, "").unwrap();
        assert!(free_names(&dir, "gpu-2026-01-02").0.ends_with("gpu-2026-01-02-3.json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn table_is_aligned_markdown() {
        let mut t = Table::new(&["shape", "k", "µs"], 1);
        t.row(vec!["gateup".into(), "4".into(), us(12.345)]);
        t.row(vec!["kv".into(), "2".into(), us(3.0)]);
        let s = t.render();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "| shape  |   k |   µs |");
        assert_eq!(lines[1], "| ------ | --: | ---: |");
        assert_eq!(lines[2], "| gateup |   4 | 12.3 |");
        assert_eq!(lines[3], "| kv     |   2 | 3.00 |");
    }

    #[test]
    fn json_values() {
        let j = Json::Obj(vec![
            ("gpu", Json::str("H100 \"SXM\"\n")),
            ("n", Json::Int(-3)),
            ("us", Json::Num(12.5)),
            ("whole", Json::Num(3.0)),
            ("nan", Json::Num(f64::NAN)),
            ("ok", Json::Bool(true)),
            ("none", Json::Null),
            ("rows", Json::Arr(vec![Json::Obj(vec![("m", Json::Int(1))]), Json::Obj(vec![])])),
        ]);
        let mut s = String::new();
        j.write(&mut s);
        assert_eq!(
            s,
            "{\"gpu\": \"H100 \\\"SXM\\\"\\n\", \"n\": -3, \"us\": 12.5, \"whole\": 3, \"nan\": null, \"ok\": true, \
             \"none\": null, \"rows\": [\n  {\"m\": 1},\n  {}\n]}"
        );
    }

    #[test]
    fn names_and_dates() {
        assert_eq!(slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(slug("  NVIDIA GeForce RTX 4090 "), "nvidia-geforce-rtx-4090");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(us(0.5), "0.50");
        assert_eq!(us(1234.5), "1234");
        assert_eq!(ratio(2.449), "2.45×");
    }
}
