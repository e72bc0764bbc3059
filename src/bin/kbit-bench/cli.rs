//! Command line of kbit-bench.

use kbit::Dtype;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: kbit-bench [OPTIONS]

Per-M tables of kbit kernel times vs cuBLAS fp16 on the DESIGN shapes
(gateup, down, q, kv, o, moe_gu, moe_dn), cold L2, CUDA-graph replay.
Results are printed as Markdown and written to OUT/<gpu>-<date>.json + .md.

options:
  --m LIST          batch sizes M (default 1-8), e.g. 1,2,4,16,64 or 1-8,16,32
  --k LIST          bit widths (default 2,3,4,5)
  --experts LIST    active experts of the moe_gu / moe_dn rows (default 8); the first
                    count's rows make the TOTAL, each further count adds two rows
  --shapes LIST     extra dense shapes after the design ones: llama8b (4096->14336),
                    llama70b (8192->28672), glm_shared (2048->10240), or KxN (K in, N out)
  --only LIST       measure only these design shapes (the TOTAL row then
                    covers only them); `none`: only the --shapes ones
  --dtype T         activations/outputs and baseline: f16 (default) or bf16
  --kernels LIST    measure only these kbit kernels (scalar, mma, dequant_cublas,
                    grouped_scalar, grouped_mma); default all
  --quick           fewer repeats and shorter replays (rough numbers, ~4x faster)
  --serial-launch   launch every kernel only after the previous one completed (by
                    default, from sm_90, GEMV and GEMM kernels are programmatic
                    dependents: their launch and prologue overlap the previous tail)
  --dequant         instead of the tables: dequantize bandwidth per k and shape
                    (design shapes + 8192x28672), and dequant + GEMM vs fp16 GEMM
  --dequant-m M     M of the GEMMs in --dequant mode (default 512)
  --out DIR         where the JSON and Markdown go (default bench-results)
  -h, --help        this text

exit status: 0 done, 1 error, 2 bad arguments, 3 no CUDA GPU";

/// One weight shape to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchShape {
    /// Row label.
    pub name: String,
    /// In features.
    pub k: usize,
    /// Out features.
    pub n: usize,
    /// Experts per call (1 for a dense layer).
    pub experts: usize,
    /// One of the 7 DESIGN shapes (counted in the TOTAL row).
    pub design: bool,
}

impl BenchShape {
    fn dense(name: &str, k: usize, n: usize, design: bool) -> Self {
        Self { name: name.into(), k, n, experts: 1, design }
    }
}

/// The 7 DESIGN §1 shapes; the MoE ones with `experts` experts.
pub fn design_shapes(experts: usize) -> Vec<BenchShape> {
    let mut v: Vec<BenchShape> =
        [("gateup", 2048, 5120), ("down", 5120, 2048), ("q", 2048, 4096), ("kv", 2048, 512), ("o", 4096, 2048)]
            .iter()
            .map(|&(name, k, n)| BenchShape::dense(name, k, n, true))
            .collect();
    v.push(BenchShape { name: "moe_gu".into(), k: 2048, n: 512, experts, design: true });
    v.push(BenchShape { name: "moe_dn".into(), k: 512, n: 2048, experts, design: true });
    v
}

/// A named extra shape, or `KxN`.
pub fn extra_shape(spec: &str) -> Result<BenchShape, String> {
    let known = [("llama8b", 4096, 14336), ("llama70b", 8192, 28672), ("glm_shared", 2048, 10240)];
    if let Some(&(name, k, n)) = known.iter().find(|s| s.0 == spec) {
        return Ok(BenchShape::dense(name, k, n, false));
    }
    let (k, n) = spec
        .split_once(['x', 'X'])
        .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
        .ok_or_else(|| format!("--shapes: unknown shape {spec:?} (known: llama8b, llama70b, glm_shared, or KxN)"))?;
    if k == 0 || k % 32 != 0 || n == 0 {
        return Err(format!("--shapes: {spec}: K must be a positive multiple of 32 and N positive"));
    }
    Ok(BenchShape::dense(spec, k, n, false))
}

/// Parsed options.
#[derive(Clone, Debug)]
pub struct Options {
    pub ms: Vec<usize>,
    pub bits: Vec<u32>,
    /// Expert counts of the MoE rows; the first one's rows are the design rows.
    pub experts: Vec<usize>,
    pub extra: Vec<BenchShape>,
    pub only: Option<Vec<String>>,
    /// Kernels to measure (`--kernels`); the others show `-`.
    pub kernels: Vec<kbit::Kernel>,
    pub dtype: Dtype,
    pub quick: bool,
    /// `--serial-launch`: no programmatic dependent launches.
    pub serial_launch: bool,
    pub dequant: bool,
    pub dequant_m: usize,
    pub out: PathBuf,
    pub help: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            ms: (1..=8).collect(),
            bits: vec![2, 3, 4, 5],
            experts: vec![8],
            extra: Vec::new(),
            only: None,
            kernels: kbit::Kernel::ALL.to_vec(),
            dtype: Dtype::F16,
            quick: false,
            serial_launch: false,
            dequant: false,
            dequant_m: 512,
            out: PathBuf::from("bench-results"),
            help: false,
        }
    }
}

impl Options {
    /// The shapes of the tables: the design ones (filtered by `--only`), the
    /// MoE ones again for each further expert count (not in the TOTAL), then
    /// the extras.
    pub fn shapes(&self) -> Vec<BenchShape> {
        let wanted = |s: &BenchShape| self.only.as_ref().is_none_or(|only| only.contains(&s.name));
        let mut v: Vec<BenchShape> = design_shapes(self.experts[0]).into_iter().filter(wanted).collect();
        for &e in &self.experts[1..] {
            let more = design_shapes(e).into_iter().filter(|s| s.name.starts_with("moe_") && wanted(s));
            v.extend(more.map(|s| BenchShape { design: false, ..s }));
        }
        v.extend(self.extra.iter().cloned());
        v
    }
}

/// `1,2,4` or ranges `1-8`; values must lie in `lo..=hi`.
fn parse_list(flag: &str, v: &str, lo: usize, hi: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in v.split(',').filter(|p| !p.is_empty()) {
        let num = |s: &str| s.trim().parse::<usize>().map_err(|_| format!("{flag}: {s:?} is not a number"));
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if a > b || a < lo || b > hi {
            return Err(format!("{flag}: {part} outside {lo}..={hi}"));
        }
        out.extend(a..=b);
    }
    if out.is_empty() {
        return Err(format!("{flag}: empty list"));
    }
    out.dedup();
    Ok(out)
}

/// Parses the arguments (without the program name).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let value = |it: &mut dyn Iterator<Item = String>| {
            inline.clone().or_else(|| it.next()).ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => o.help = true,
            "--quick" => o.quick = true,
            "--serial-launch" => o.serial_launch = true,
            "--dequant" => o.dequant = true,
            "--m" => o.ms = parse_list("--m", &value(&mut it)?, 1, 1 << 20)?,
            "--k" => o.bits = parse_list("--k", &value(&mut it)?, 2, 5)?.into_iter().map(|b| b as u32).collect(),
            "--experts" => o.experts = parse_list("--experts", &value(&mut it)?, 1, 1024)?,
            "--dequant-m" => o.dequant_m = parse_list("--dequant-m", &value(&mut it)?, 1, 1 << 20)?[0],
            "--shapes" => {
                for s in value(&mut it)?.split(',').filter(|s| !s.is_empty()) {
                    o.extra.push(extra_shape(s)?);
                }
            }
            "--only" => {
                let names: Vec<String> =
                    value(&mut it)?.split(',').filter(|s| !s.is_empty() && *s != "none").map(String::from).collect();
                let known = design_shapes(1);
                if let Some(bad) = names.iter().find(|n| !known.iter().any(|s| &s.name == *n)) {
                    return Err(format!(
                        "--only: {bad:?} is not a design shape (gateup, down, q, kv, o, moe_gu, moe_dn)"
                    ));
                }
                o.only = Some(names);
            }
            "--kernels" => {
                o.kernels = value(&mut it)?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|n| kbit::Kernel::from_name(n).ok_or_else(|| format!("--kernels: unknown kernel {n:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--dtype" => {
                o.dtype = match value(&mut it)?.as_str() {
                    "f16" | "fp16" => Dtype::F16,
                    "bf16" => Dtype::Bf16,
                    other => return Err(format!("--dtype: {other:?} (f16 or bf16)")),
                }
            }
            "--out" => o.out = PathBuf::from(value(&mut it)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults() {
        let o = parse(args("")).unwrap();
        assert_eq!(o.ms, (1..=8).collect::<Vec<_>>());
        assert_eq!(o.bits, vec![2, 3, 4, 5]);
        assert_eq!(o.experts, [8]);
        assert_eq!(o.shapes().len(), 7);
        assert_eq!(o.shapes()[5], BenchShape { name: "moe_gu".into(), k: 2048, n: 512, experts: 8, design: true });
    }

    #[test]
    fn lists_ranges_and_shapes() {
        let o = parse(args(
            "--m 1-3,16,64 --k=4 --experts 10 --shapes llama70b,4096x11008 --only kv,moe_dn --quick --serial-launch",
        ))
        .unwrap();
        assert_eq!(o.ms, vec![1, 2, 3, 16, 64]);
        assert_eq!(o.bits, vec![4]);
        assert!(o.quick && o.serial_launch);
        let s = o.shapes();
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["kv", "moe_dn", "llama70b", "4096x11008"]);
        assert_eq!((s[1].experts, s[2].k, s[2].n, s[3].k, s[3].n), (10, 8192, 28672, 4096, 11008));
        let extra_only = parse(args("--shapes llama70b --only none")).unwrap().shapes();
        assert_eq!(extra_only.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["llama70b"]);
        assert!(!s[2].design);
    }

    #[test]
    fn further_expert_counts_add_moe_rows_outside_the_total() {
        let o = parse(args("--experts 8,16,24 --only q,moe_dn --shapes glm_shared")).unwrap();
        let s = o.shapes();
        let rows: Vec<(&str, usize, bool)> = s.iter().map(|s| (s.name.as_str(), s.experts, s.design)).collect();
        assert_eq!(
            rows,
            [
                ("q", 1, true),
                ("moe_dn", 8, true),
                ("moe_dn", 16, false),
                ("moe_dn", 24, false),
                ("glm_shared", 1, false)
            ]
        );
        assert_eq!(parse(args("--experts 4-6")).unwrap().shapes().len(), 7 + 2 * 2);
    }

    #[test]
    fn errors_name_the_argument() {
        for (a, want) in [
            ("--k 6", "--k"),
            ("--experts 0", "--experts"),
            ("--m 0", "--m"),
            ("--m", "needs a value"),
            ("--shapes foo", "unknown shape"),
            ("--shapes 100x64", "multiple of 32"),
            ("--only llama8b", "--only"),
            ("--dtype f32", "--dtype"),
            ("--frobnicate", "unknown argument"),
        ] {
            let e = parse(args(a)).unwrap_err();
            assert!(e.contains(want), "{a}: {e}");
        }
    }
}
